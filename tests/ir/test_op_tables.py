"""Every op has an entry in every per-op table, and the type rules say what they should.

The op set is data (``Op``); behaviour lives in tables: the type rule and arity
(``sarc.ir.ops``), the reference implementation (``sarc.ir.interpreter.IMPLS``)
and the PyTorch lowering (``sarc.backends.torch_backend.LOWERING``). Adding an op
without its table entries fails here.
"""
from __future__ import annotations

import pytest

from sarc.backends.torch_backend import LOWERING
from sarc.errors import DSLError, SourceLoc
from sarc.ir.function import Builder
from sarc.ir.interpreter import IMPLS
from sarc.ir.ops import ARITY, LEAVES, TYPE_RULES, Op, TypeError_, binary_type, infer_type
from sarc.ir.types import Domain, DType, TensorType

# Leaves have no operands and no implementation: INPUT / PARAM / CONST are read from
# the call's tensors, a region's ARG from the fused op's operands.
ALL_LEAVES = LEAVES | {Op.ARG}

SRC, DST, EDGE, PARAM = Domain.SRC, Domain.DST, Domain.EDGE, Domain.PARAM


def t(domain: Domain, *feat: int, dtype: DType = DType.F32) -> TensorType:
    return TensorType(domain, dtype, tuple(feat))


@pytest.mark.parametrize("op", list(Op), ids=lambda op: op.value)
def test_every_op_has_every_table_entry(op):
    assert op in TYPE_RULES, f"{op} has no type rule"
    assert op in ARITY, f"{op} has no arity"
    assert op in LOWERING, f"{op} has no PyTorch lowering"
    if op in ALL_LEAVES:
        assert ARITY[op] == 0, f"leaf {op} takes operands"
    else:
        assert op in IMPLS, f"{op} has no reference implementation in the interpreter"


def test_tables_name_only_ops():
    for table in (TYPE_RULES, ARITY, IMPLS, LOWERING):
        assert all(isinstance(k, Op) for k in table)


# --- broadcasting of params against graph values ------------------------------------------

@pytest.mark.parametrize("param_feat, expect", [
    ((1, 4, 3), (4, 3)),   # PyG's att [1, H, C]: its first dim lines up with the row axis
    ((4, 3), (4, 3)),
    ((3,), (4, 3)),
    ((4, 1), (4, 3)),
    ((1,), (4, 3)),
    ((), (4, 3)),
])
def test_param_broadcasts_against_edge_value(param_feat, expect):
    edge = t(EDGE, 4, 3)
    param = t(PARAM, *param_feat)
    for a, b in ((edge, param), (param, edge)):
        out = infer_type(Op.MUL, [a, b], {})
        assert out == t(EDGE, *expect)
        assert out.shape[0].name == "E"


def test_param_broadcast_widens_a_size_one_feature():
    assert infer_type(Op.ADD, [t(DST, 1), t(PARAM, 5)], {}) == t(DST, 5)


def test_param_covering_the_row_axis_is_an_error():
    with pytest.raises(TypeError_, match=r"\[2, 4, 3\].*row axis"):
        infer_type(Op.MUL, [t(EDGE, 4, 3), t(PARAM, 2, 4, 3)], {})


@pytest.mark.parametrize("param_feat", [(1, 1, 4, 3), (1, 1, 3)])
def test_param_with_more_dims_than_the_value_is_an_error(param_feat):
    """torch would broadcast [1, 1, H, C] * [E, H, C] to [1, E, H, C]: not a per-edge value."""
    with pytest.raises(TypeError_, match="more dims"):
        infer_type(Op.MUL, [t(EDGE, 4, 3) if len(param_feat) == 4 else t(EDGE, 3),
                            t(PARAM, *param_feat)], {})


def test_param_against_a_scalar_per_row():
    assert binary_type(t(EDGE), t(PARAM, 1)) == t(EDGE)
    with pytest.raises(TypeError_):
        binary_type(t(EDGE), t(PARAM, 1, 1))
    with pytest.raises(TypeError_):
        binary_type(t(EDGE), t(PARAM, 5))


def test_params_broadcast_with_each_other():
    assert infer_type(Op.ADD, [t(PARAM, 3, 1), t(PARAM, 4)], {}) == t(PARAM, 3, 4)


# --- domain, shape and dtype errors ------------------------------------------------------------

@pytest.mark.parametrize("a, b", [(SRC, DST), (DST, SRC), (SRC, EDGE), (EDGE, DST)])
def test_mixing_domains_is_an_error(a, b):
    with pytest.raises(TypeError_, match=f"cannot combine {a.article} value .* with {b.article} value"):
        infer_type(Op.ADD, [t(a, 3), t(b, 3)], {})


def test_mixing_edge_and_node_values_suggests_a_gather():
    with pytest.raises(TypeError_, match="without a gather"):
        infer_type(Op.MUL, [t(EDGE, 3), t(DST, 3)], {})


def test_shape_mismatch_is_an_error():
    with pytest.raises(TypeError_, match=r"feature shapes \[3\] and \[4\] do not broadcast"):
        infer_type(Op.SUB, [t(EDGE, 3), t(EDGE, 4)], {})
    with pytest.raises(TypeError_, match="do not broadcast"):
        infer_type(Op.ADD, [t(EDGE, 2, 3), t(PARAM, 3, 3)], {})


def test_graph_values_broadcast_size_one_features():
    assert infer_type(Op.MUL, [t(EDGE, 4, 3), t(EDGE, 4, 1)], {}) == t(EDGE, 4, 3)
    assert infer_type(Op.MUL, [t(EDGE, 1), t(EDGE, 5)], {}) == t(EDGE, 5)


def test_dtype_mismatch_and_integer_math_are_errors():
    with pytest.raises(TypeError_, match="dtype mismatch"):
        infer_type(Op.ADD, [t(EDGE, 3), t(EDGE, 3, dtype=DType.F64)], {})
    with pytest.raises(TypeError_, match="integer"):
        infer_type(Op.ADD, [t(EDGE, dtype=DType.I64), t(EDGE, dtype=DType.I64)], {})
    with pytest.raises(TypeError_, match="integer"):
        infer_type(Op.RELU, [t(EDGE, dtype=DType.I64)], {})


def test_arity_is_checked():
    with pytest.raises(TypeError_, match="add takes 2 inputs, got 1"):
        infer_type(Op.ADD, [t(EDGE, 3)], {})


# --- graph ops ---------------------------------------------------------------------------

def test_gathers_move_node_values_to_edges():
    assert infer_type(Op.GATHER_SRC, [t(SRC, 3)], {}) == t(EDGE, 3)
    assert infer_type(Op.GATHER_DST, [t(DST, 2, 3)], {}) == t(EDGE, 2, 3)
    with pytest.raises(TypeError_, match="gather from src applied to a dst value"):
        infer_type(Op.GATHER_SRC, [t(DST, 3)], {})
    with pytest.raises(TypeError_, match="gather from dst applied to an edge value"):
        infer_type(Op.GATHER_DST, [t(EDGE, 3)], {})


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reduce_moves_edge_values_to_dst(kind):
    assert infer_type(Op.REDUCE, [t(EDGE, 4, 3)], {"kind": kind}) == t(DST, 4, 3)


@pytest.mark.parametrize("domain", [SRC, DST, PARAM])
def test_reduce_of_a_non_edge_value_is_an_error(domain):
    with pytest.raises(TypeError_, match=f"its input is a {domain.value} value"):
        infer_type(Op.REDUCE, [t(domain, 3)], {"kind": "sum"})


def test_reduce_kind_and_dtype_are_checked():
    with pytest.raises(TypeError_, match="unknown reduction 'prod'"):
        infer_type(Op.REDUCE, [t(EDGE, 3)], {"kind": "prod"})
    with pytest.raises(TypeError_, match="integer"):
        infer_type(Op.REDUCE, [t(EDGE, dtype=DType.I64)], {"kind": "sum"})


def test_edge_softmax_needs_edge_scores():
    assert infer_type(Op.EDGE_SOFTMAX, [t(EDGE, 4)], {}) == t(EDGE, 4)
    with pytest.raises(TypeError_, match="edge_softmax"):
        infer_type(Op.EDGE_SOFTMAX, [t(DST, 4)], {})


# --- linear algebra ---------------------------------------------------------------------------

def test_linear_shapes():
    assert infer_type(Op.LINEAR, [t(EDGE, 4, 7), t(PARAM, 5, 7)], {}) == t(EDGE, 4, 5)
    with pytest.raises(TypeError_, match=r"input has 6 features but the weight expects 7 \(weight shape \[5, 7\]\)"):
        infer_type(Op.LINEAR, [t(SRC, 6), t(PARAM, 5, 7)], {})
    with pytest.raises(TypeError_, match="2-d weight parameter"):
        infer_type(Op.LINEAR, [t(SRC, 7), t(SRC, 7)], {})
    with pytest.raises(TypeError_, match="2-d weight parameter"):
        infer_type(Op.LINEAR, [t(SRC, 7), t(PARAM, 2, 5, 7)], {})


def test_matmul_shapes():
    assert infer_type(Op.MATMUL, [t(DST, 2, 3), t(PARAM, 3, 5)], {}) == t(DST, 2, 5)
    with pytest.raises(TypeError_, match="do not match"):
        infer_type(Op.MATMUL, [t(DST, 4), t(PARAM, 3, 5)], {})


def test_index_and_typed_linear():
    etype = t(EDGE, dtype=DType.I64)
    assert infer_type(Op.INDEX, [t(PARAM, 3, 4, 5), etype], {}) == t(EDGE, 4, 5)
    with pytest.raises(TypeError_, match="int64 scalar per row"):
        infer_type(Op.INDEX, [t(PARAM, 3, 4), t(EDGE)], {})
    with pytest.raises(TypeError_, match="only parameter tables"):
        infer_type(Op.INDEX, [t(SRC, 4), etype], {})
    assert infer_type(Op.TYPED_LINEAR, [t(EDGE, 4), t(PARAM, 3, 4, 6), etype], {}) == t(EDGE, 6)
    with pytest.raises(TypeError_, match="does not match the weight table"):
        infer_type(Op.TYPED_LINEAR, [t(EDGE, 5), t(PARAM, 3, 4, 6), etype], {})
    with pytest.raises(TypeError_, match="type id per row of the input's domain"):
        infer_type(Op.TYPED_LINEAR, [t(EDGE, 4), t(PARAM, 3, 4, 6), t(SRC, dtype=DType.I64)], {})


# --- shape ops ----------------------------------------------------------------------------------

def test_reshape_concat_sum_axis():
    assert infer_type(Op.RESHAPE, [t(EDGE, 12)], {"feat": (4, 3)}) == t(EDGE, 4, 3)
    with pytest.raises(TypeError_, match="cannot reshape"):
        infer_type(Op.RESHAPE, [t(EDGE, 12)], {"feat": (5, 3)})
    assert infer_type(Op.CONCAT, [t(DST, 2, 3), t(DST, 2, 4)], {"axis": -1}) == t(DST, 2, 7)
    assert infer_type(Op.CONCAT, [t(DST, 2, 3), t(DST, 5, 3)], {"axis": 0}) == t(DST, 7, 3)
    with pytest.raises(TypeError_, match="differ off the concat axis"):
        infer_type(Op.CONCAT, [t(DST, 2, 3), t(DST, 5, 3)], {"axis": 1})
    with pytest.raises(TypeError_, match="concat of a dst and a src value"):
        infer_type(Op.CONCAT, [t(DST, 3), t(SRC, 3)], {"axis": 0})
    assert infer_type(Op.SUM_AXIS, [t(EDGE, 4, 3)], {"axis": -1}) == t(EDGE, 4)
    assert infer_type(Op.SUM_AXIS, [t(EDGE, 4, 3)], {"axis": 0}) == t(EDGE, 3)
    with pytest.raises(TypeError_, match="out of range"):
        infer_type(Op.SUM_AXIS, [t(EDGE, 4, 3)], {"axis": 2})


# --- the builder turns type errors into DSL errors at the user's line ------------------------

def test_builder_reports_type_errors_at_the_given_location():
    b = Builder("Bad")
    h = b.leaf(Op.INPUT, "h", t(SRC, 3))
    w = b.leaf(Op.PARAM, "w", t(PARAM, 4, 5))
    loc = SourceLoc("/somewhere/model.py", 42, "message")
    with pytest.raises(DSLError) as info:
        b.add(Op.LINEAR, [b.add(Op.GATHER_SRC, [h]), w], loc=loc)
    assert info.value.loc == loc
    assert str(info.value).startswith("/somewhere/model.py:42 (in message): linear: input has 3 features")


# --- conversions --------------------------------------------------------------------------------

def test_cast_converts_to_another_float_dtype():
    f16, i64 = DType.F16, DType.I64
    assert infer_type(Op.CAST, [t(EDGE, 4, 3, dtype=f16)], {"dtype": DType.F32}) == t(EDGE, 4, 3)
    bf16 = DType.BF16
    assert infer_type(Op.CAST, [t(PARAM, 3)], {"dtype": bf16}) == t(PARAM, 3, dtype=bf16)
    assert infer_type(Op.CAST, [t(SRC, dtype=i64)], {"dtype": f16}) == t(SRC, dtype=f16)
    with pytest.raises(TypeError_, match="to float dtypes only"):
        infer_type(Op.CAST, [t(EDGE, 3)], {"dtype": i64})
    with pytest.raises(TypeError_, match="to its own dtype"):
        infer_type(Op.CAST, [t(EDGE, 3, dtype=f16)], {"dtype": f16})
    with pytest.raises(TypeError_, match="needs a dtype attribute"):
        infer_type(Op.CAST, [t(EDGE, 3)], {"dtype": "f16"})


def test_cast_prints_its_dtype():
    from sarc.ir.printer import format_function
    b = Builder("Cast")
    h = b.leaf(Op.INPUT, "h", t(DST, 3, dtype=DType.F16))
    fn = b.finish([("h", b.add(Op.CAST, [b.add(Op.CAST, [h], {"dtype": DType.F32})],
                               {"dtype": DType.F16}))])
    text = format_function(fn, with_loc=False)
    assert "dst f32[N_dst,3] = cast(%0, dtype=f32)" in text
    assert "dst f16[N_dst,3] = cast(%1, dtype=f16)" in text
