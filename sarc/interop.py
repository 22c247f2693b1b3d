"""Converting graphs between sarc, PyG and DGL.

- ``from_pyg(edge_index, num_nodes)``: a PyG ``edge_index`` ``[2, E]`` (row 0
  the source, row 1 the target: PyG's default ``flow="source_to_target"``) as a
  ``sarc.Graph``.
- ``from_dgl(g)``: a homogeneous DGL graph, or a DGL block (message flow graph
  from ``dgl.to_block``), as a ``sarc.Graph``.
- ``to_dgl(g)``: a ``sarc.Graph`` as a DGL graph, or a DGL block when it is a
  block (``num_src != num_dst``, or a split block).

Edge ids are kept: edge ``i`` of the PyG/DGL graph is edge ``i`` of the sarc
graph, so edge features (``etype``, ``norm``) pass through in the same order,
and ``to_dgl(from_dgl(g))`` has ``g``'s edges in ``g``'s order. Degrees are
counted on the edges given, as PyG and DGL layers count them.

DGL is imported inside the functions that need it, never when sarc is imported.
"""
from __future__ import annotations

import torch

from .errors import GraphError
from .graph import Graph


def from_pyg(edge_index, num_nodes: int | tuple[int, int]) -> Graph:
    """A sarc graph from a PyG ``edge_index`` (``[2, E]``, source row first).

    ``num_nodes`` is the node count, or ``(num_src, num_dst)`` for a bipartite
    block (PyG's ``size``) whose destination nodes are its first ``num_dst``
    source nodes. It is required: PyG infers it from the largest id, which
    drops isolated nodes at the end.
    """
    edge_index = torch.as_tensor(edge_index)
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise GraphError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if isinstance(num_nodes, tuple):
        num_src, num_dst = num_nodes
        return Graph.from_edges(edge_index[0], edge_index[1], num_src=num_src, num_dst=num_dst)
    return Graph.from_edges(edge_index[0], edge_index[1], num_nodes)


def from_dgl(g, *, dst_in_src: bool = True) -> Graph:
    """A sarc graph from a homogeneous DGL graph or block.

    A graph gives ``num_src == num_dst == g.num_nodes()``. A block gives
    ``num_src = g.num_src_nodes()``, ``num_dst = g.num_dst_nodes()``; sarc, like
    DGL's layers on blocks, takes the destination nodes to be the first
    ``num_dst`` source nodes, as ``dgl.to_block`` makes them. A block made with
    ``include_dst_in_src=False`` is a split block: pass ``dst_in_src=False``.
    A block whose node ids (``dgl.NID``) contradict ``dst_in_src=True`` is an
    error, not a silently wrong graph.
    """
    import dgl
    if len(g.canonical_etypes) != 1:
        raise GraphError(f"from_dgl takes a homogeneous graph or block, got edge types "
                         f"{g.canonical_etypes}; convert with dgl.to_homogeneous first")
    if not g.is_block and len(g.ntypes) != 1:   # one relation between two node types
        raise GraphError(f"from_dgl takes a homogeneous graph or block, got node types "
                         f"{g.ntypes} (relation {g.canonical_etypes[0]}), whose ids each "
                         f"start at 0; convert with dgl.to_homogeneous first")
    src, dst = (t.cpu() for t in g.edges(order="eid"))
    if not g.is_block:
        return Graph.from_edges(src, dst, g.num_nodes()).to(g.device)
    num_src, num_dst = g.num_src_nodes(), g.num_dst_nodes()
    if dst_in_src and dgl.NID in g.srcdata and dgl.NID in g.dstdata:
        if num_dst > num_src or not bool((g.srcdata[dgl.NID][:num_dst] == g.dstdata[dgl.NID]).all()):
            raise GraphError("this DGL block's dst nodes are not its first src nodes (by their "
                             "dgl.NID ids); pass dst_in_src=False for a split block")
    return Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst,
                            dst_in_src=dst_in_src).to(g.device)


def to_dgl(g: Graph):
    """``g`` as a DGL graph, or a DGL block when it is one, edges in input order.

    A block (``num_src != num_dst``) or a split block (``dst_in_src=False``)
    becomes ``dgl.create_block``; anything else a ``dgl.graph``.
    """
    import dgl
    src, dst = g.input_edges()
    if g.num_src == g.num_dst and g.dst_in_src:
        return dgl.graph((src, dst), num_nodes=g.num_src)
    return dgl.create_block((src, dst), num_src_nodes=g.num_src, num_dst_nodes=g.num_dst)


__all__ = ["from_pyg", "from_dgl", "to_dgl"]
