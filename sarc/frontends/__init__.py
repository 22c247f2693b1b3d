"""Front ends: other libraries' layers and calling conventions on sarc layers.

``sarc.frontends.pyg`` imports PyG ``MessagePassing`` layers into the DSL and wraps a
sarc layer as a PyG convolution. The libraries are imported inside the functions that
need them, never when sarc is imported.
"""
