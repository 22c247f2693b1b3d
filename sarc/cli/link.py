"""``sarc train --task link``: link prediction on a dataset's edges, its options checked
before any work, the run on one process (``sarc.training.link``; on P workers
``sarc.distributed.link``)."""
from __future__ import annotations


from ..loader import parse_overrides
from ..names import one_line
from ..training.link import LINK_DEFAULTS, hits_text, train_links
from ..training.loop import write_result
from .options import UsageError


def check_link_args(args, spec) -> None:
    """``sarc train --task link``'s options and model file, checked before any work;
    ``--negatives`` becomes the ``negatives`` hyperparameter (so the workers get it)."""
    missing = [k for k in LINK_DEFAULTS if k not in spec.hparams]
    if missing:
        raise UsageError(f"--task link: {spec.path or spec.name} is not a link-prediction model "
                         f"file (its HPARAMS have no {', '.join(missing)}; a link model's "
                         f"module has score(h_u, h_v), see models/sage_lp.py)")
    given = [f for f, on in (("--checkpoint", getattr(args, "checkpoint", None)),
                             ("--save", getattr(args, "save", None))) if on]
    if given:
        raise UsageError(f"{', '.join(given)}: not supported with --task link")
    if getattr(args, "partition", None):
        raise UsageError("--partition: --task link partitions the dataset itself (its val and "
                         "test edges leave the message graph first); leave --partition out")
    if args.negatives:
        args.overrides = [*args.overrides, f"negatives={args.negatives!r}"]


def link_command(args, spec, data) -> int:
    """``sarc train --task link`` on one process: train, print the result (the log's last
    line; with --quiet the only line), write --json."""
    result = train_links(spec, data, epochs=args.epochs, seed=args.seed,
                         hparams=parse_overrides(args.overrides), log=None if args.quiet else print,
                         log_every=args.log_every, eval_every=args.eval_every, device=args.device, backend=args.backend)
    if args.quiet:  # otherwise the run's log ends with it (``selected epoch ...``)
        print(f"{one_line(result['model'])} on {one_line(result['dataset'])} (seed {result['seed']}, link "
              f"prediction): test mrr {result['test_mrr']:.4f}{hits_text(result)} (val mrr "
              f"{result['val_mrr']:.4f}, epoch {result['best_epoch']} of {result['epochs']})")
    if args.json:
        write_result(args.json, result)
    return 0
