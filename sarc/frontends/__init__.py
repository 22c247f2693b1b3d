"""Front ends: layers written for other GNN libraries, compiled by sarc.

Each front end traces a library's unmodified layer into sarc's IR, so the layer
plans, runs on every backend and distributes as a DSL layer does. The library is
imported inside the front end's functions, never when sarc is imported.
"""
