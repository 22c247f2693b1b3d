"""Front ends: layers written for other GNN libraries, compiled by sarc.

Each front end traces a library's unmodified layer into sarc's IR, so the layer plans,
runs on every backend and distributes as a DSL layer does: ``sarc.frontends.dgl``
(DGL's nn modules, ``patch()``) and ``sarc.frontends.pyg`` (PyG ``MessagePassing``
layers; a sarc layer as a PyG convolution). The libraries are imported inside the
front ends' functions, never when sarc is imported.
"""
