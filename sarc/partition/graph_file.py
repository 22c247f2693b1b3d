"""A graph in one ``.npz`` file (``sarc partition --graph``): its edge list, its node
count, and the per-node and per-edge arrays carried along."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import GraphError

EDGE_LIST = ("edge_src", "edge_dst")


def load_npz_graph(path, *, check: bool = True):
    """(src, dst, num_nodes, node_data, edge_data) of an ``.npz`` graph file.

    Its arrays are checked as a dataset's are (``sarc.datasets.check_arrays``: the edge
    list in range, and ``label``, the masks, ``feat`` and ``etype`` where present), with
    ``edge_src``, ``edge_dst`` and ``num_nodes`` required.
    """
    from ..datasets import check_arrays, read_npz

    raw = read_npz(path)
    arrays = check_arrays(raw, str(path), required=(*EDGE_LIST, "num_nodes"), check=check)
    src, dst = (torch.from_numpy(arrays[k]) for k in EDGE_LIST)
    num_nodes = arrays["num_nodes"]
    node_data, edge_data = {}, {}
    for k in raw:
        a = np.asarray(arrays[k])
        if k in EDGE_LIST or a.ndim == 0 or a.dtype.kind not in "biuf":
            continue
        if k == "etype" or k.startswith("edge_"):
            if a.shape[0] != src.numel():
                raise GraphError(f"{path}: edge array {k!r} has {a.shape[0]} rows, "
                                 f"the graph has {src.numel()} edges")
            edge_data[k] = torch.from_numpy(np.ascontiguousarray(a))
        elif a.shape[0] == num_nodes:
            node_data[k] = torch.from_numpy(np.ascontiguousarray(a))
    return src, dst, num_nodes, node_data, edge_data
