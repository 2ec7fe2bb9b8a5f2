"""The section of docs/performance.md on calls of many shapes in graph mode: what chunks of time cost against whole
calls and in the ladder, a load probe of random (T, B) calls (recordings, memory, time against one fixed shape), and
the LSTM's cost by B that the B ladder pads along."""
from __future__ import annotations

from ..ir.loading import load_cell
from ..nn.buckets import bucket
from ..plan.schedule import build_schedule
from ..run.backends.cuda.persistent.runner import GROUP_ROWS
from ..run.chunk_plan import LADDER_TOP, spans
from ..run.settings import default_store_limit
from ..run.workspace import stash_size
from .report_data import Findings, Results, num, source, table, times

LATE = ": the later ones, each recorded once, are chunk lengths at B steps that none of the first {} calls ran"


def _padded_b(records: list) -> str:
    """A sentence on the rows whose ladder pads B, if any: there the ladder column is mostly that padding."""
    padded = sorted({r["B"] for r in records if bucket(r["B"]) != r["B"]})
    if not padded:
        return ""
    Bs = ", ".join(f"{B} to {bucket(B)}" for B in padded)
    return (f" The ladder also pads B ({Bs}), which is most of its cost in those rows: a minGRU's scan and "
            f"elementwise loop, and the LSTM in float32, take longer padded than at their own B (the LSTM's cost "
            f"by B is below).")


def shapes(results: Results, findings: Findings) -> str:
    chunks, probe = results.bench("chunks"), results.bench("shapes")
    rows = []
    for r in chunks["records"]:
        K = f"{r['K']}" if r["K"] else "whole calls"
        whole, chunked, ladder = (num(r[f"{k}_ms"]) + (" (recomputes)" if r.get(f"{k}_recomputed") else "")
                                  for k in ("whole", "chunks", "ladder"))
        ran = r["loop"] if r["ran"] == r["loop"] else f"{r['loop']} (runs {r['ran']})"
        rows.append([r["cell"], ran, r["T"], r["B"], K, whole, chunked,
                     times(r["chunks_ms"] / r["whole_ms"]), ladder, times(r["ladder_ms"] / r["whole_ms"])])
    cost = lambda r: r["chunks_ms"] / r["whole_ms"]        # noqa: E731
    plain = [r for r in chunks["records"] if r["loop"] != "scan" and r["T"] > r["K"]]     # calls that run in chunks
    worst, best = max(plain, key=cost), min(plain, key=cost)
    scan = max((r for r in chunks["records"] if r["loop"] == "scan"), key=cost)
    K = worst["K"]
    sched = build_schedule(load_cell(worst["cell"], worst["H"], worst["H"]))
    aside = stash_size(sched, K, worst["B"], "float32") * 4 / 1e9      # the values its backward reads, float32
    s, st, last = probe["summary"], probe["settings"], probe["records"][-1]
    (Tm, Bm) = s["fixed_shape"]
    Bs = range(st["bmin"], st["bmax"] + 1)
    padded = sum(bucket(B) for B in Bs) / len(Bs)        # the mean B once padded to its step
    limit = default_store_limit(int(chunks["metadata"]["gpu_memory_gib"] * 2**30))     # the chunk run's GPU's
    findings.compare("Calls of many shapes", f"{st['calls']:,} calls of random shapes", {"train_ms": s["ms_per_call"]},
                     {"train_ms": s["fixed_ms_per_call"]}, f"one fixed shape (T = {Tm}, B = {Bm})")
    findings.compare("Calls of many shapes", f"{s['paired_calls']} calls of random shapes as the shape policy runs "
                     "them",
                     {"train_ms": s["paired_policy_ms"]}, {"train_ms": s["paired_exact_ms"]},
                     "exact-shape replay")
    return f"""## Calls of many shapes

A training step (forward and backward) in graph mode, H = {chunks['settings']['H']}, float32: in chunks of {K}
frames (the default of `stages`, `elementwise` and `persistent`; the scan, which runs whole calls by default, is
given them through `RNNGRAPH_CHUNK_FRAMES` to show what they would cost it), in whole calls (chunks off), and in
the ladder of chunks that calls of many lengths run in (`buckets=True`, which also pads B to its step: 1 to
{bucket(1)}), interleaved in one process; milliseconds, and the ratio to whole calls.

{table(["cell", "loop", "T", "B", "chunk K", "whole calls", "chunks", "chunks ÷ whole", "ladder", "ladder ÷ whole"], rows)}

{source(chunks)}

Where the values a call stores exceed `RNNGRAPH_STORE_BYTES` ({limit / 1e9:.1f} GB by default on this GPU) the
backward recomputes (marked "recomputes"), and with chunks off it does so in chunks of a quarter of that limit,
so there "whole calls" run in chunks too. Calls longer than {K} frames take {times(cost(best))} to
{times(cost(worst))} the time of whole calls in chunks; the costliest case is {worst['cell']} ({worst['loop']}) at T = {worst['T']}, B = {worst['B']}, where
every chunk but the last sets the values its backward reads aside, {aside:.2f} GB a chunk of {K} frames copied out
and back (computed, not timed apart). The scan in chunks takes up to {times(cost(scan))} (T = {scan['T']}, B = {scan['B']}), so it runs whole
calls. In the ladder, the `persistent`, `elementwise` and `scan` kernels walk only the frames a chunk holds, so
T = 1000 runs as {_chunks(spans(1000, K, True, walks=True))} (the scan, whose ladder starts at {LADDER_TOP} frames,
as {_chunks(spans(1000, LADDER_TOP, True, walks=True))}); `stages` runs it as {_chunks(spans(1000, K, True))}, which
costs most where a step is shortest.{_padded_b(chunks["records"])}

An LSTM layer (H = {st['H']}, graph mode, float32, the automatic shape policy) fed {st['calls']:,} training steps
of random shapes, T in [{st['tmin']}, {st['tmax'] - 1}] and B in [{st['bmin']}, {st['bmax']}]: it holds
{s['graphs_at_warm_up']} recordings after {st['warm']} calls and records {s['graphs_after_warm_up']} after that
({last['graphs']} in all, {num(last['graph_mb'])} MB){LATE.format(st['warm']) if s['graphs_after_warm_up'] else ''}.
Its arenas stay at {num(last['arenas_mb'])} MB and the memory
pool holds {last['pool_held_mb']:,.0f} MB from the first tenth of the run to the last; the device memory in use is
{s['device_mb_at_warm_up']:,.0f} MB after {st['warm']} calls and {last['device_mb']:,.0f} MB after the last.
{s['recomputed_calls']:,} of the calls recompute (the store limit is {s['store_limit_bytes'] / 1e9:.1f} GB). A call
takes {num(s['ms_per_call'])} ms on average, {s['ratio']:.3f}× the time of one fixed shape of the mean size
(T = {Tm}, B = {Bm}, {num(s['fixed_ms_per_call'])} ms). The mean size is not the
mean cost: at B = {Bm} the GPU runs {s['fixed_loop']}, while calls of B = {Bm + 1} to {st['bmax']}, padded to
{bucket(Bm + 1)} rows, run {s['padded_loop'].split(':')[0]}, as they would at their exact sizes. Against the same
calls, each replayed at its own exact shape ({s['paired_calls']} calls of the second half, interleaved call by call),
the policy's calls take {s['paired_ratio']:.3f}× the time ({num(s['paired_policy_ms'])} against
{num(s['paired_exact_ms'])} ms){_padding(s, f"its step of the ladder (a mean of {padded:.1f} rows for "
                                          f"{sum(Bs) / len(Bs):.1f})")}. The {st['check']} calls
checked against staged mode agree to {s['worst_relative_error']:.1e} (relative, float32).

{source(probe)}

{_by_batch(results.bench("batch_curve"), Bm)}"""


def _by_batch(doc: dict, Bm: int) -> str:
    """One shape's training step by B (the probe's layer, replayed at each exact B): the cost curve the B ladder
    pads along, and the sizes that split into no row groups."""
    st, rows = doc["settings"], []
    at = {(r["impl"], r["B"]): r for r in doc["results"]}
    ref = at[("graph", Bm)]["train_ms"]
    for B in st["B"]:
        ours = at[("graph", B)]
        rows.append([B, bucket(B), num(ours["train_ms"]), times(ours["train_ms"] / ref),
                     ours["gpu_loop"].removeprefix("persistent ").strip("()"), num(at[("cudnn", B)]["train_ms"])])
    (T,), (H,) = st["T"], st["H"]
    return f"""The same LSTM at one shape, T = {T}, H = {H}, float32, at each B (`rnngraph bench`, each B replayed;
training step, milliseconds; cuDNN float32 beside it). The B ladder pads along this curve. Beyond 16 rows the
tensor-core loop splits the batch into row groups of 4 to 8 rows where B divides into them;
{_ungrouped(at, ref, Bm)}. Every step of the ladder splits.

{table(["B", "ladder step", "rnngraph", f"÷ B = {Bm}", "kernel", "cuDNN float32"], rows)}

{source(doc)}"""


def _ungrouped(at: dict, ref: float, Bm: int) -> str:
    """What the rows beyond 16 that divide into no row group ran as (at: (impl, B) -> record): one group of B rows
    where the stored run kept them so, else padded to a multiple of GROUP_ROWS, as runner.padded_rows pads them."""
    loop = {B: r["gpu_loop"] for (impl, B), r in at.items() if impl == "graph" and B > 16}
    whole = [B for B in sorted(loop) if "groups" not in loop[B]]
    odd = whole or [B for B in sorted(loop) if "B padded to" in loop[B]]
    if not odd:
        return "every B measured here does"
    Bs, rows = ", ".join(map(str, odd)), ", ".join(str(-(-B // GROUP_ROWS) * GROUP_ROWS) for B in odd)
    took = f"{', '.join(times(at[('graph', B)]['train_ms'] / ref) for B in odd)} the time of B = {Bm}"
    if whole:
        return (f"at their exact size B = {Bs} do not, run one group of B rows, and take {took}, so a call of such "
                f"a B runs padded to the next multiple of {GROUP_ROWS} rows ({rows}), which splits")
    return f"B = {Bs} do not, so they run padded to the next multiple of {GROUP_ROWS} rows ({rows}), which splits, " \
           f"and take {took}"


def _padding(s: dict, step: str) -> str:
    """What padding B to `step` and the ladder's chunks cost the probe's paired calls (its summary s), apart: the
    probe also times them at their exact T with B padded."""
    D = s["paired_padded_ms"]
    return (f". At their exact T with B padded to {step}, they take {num(D)} ms: the ladder's chunks of at most "
            f"{s['chunk_frames']} frames cost {s['paired_policy_ms'] / D:.3f}× and padding B "
            f"{D / s['paired_exact_ms']:.3f}×")


def _chunks(sp: list) -> str:
    """A call's chunks (spans) in words: 'one chunk of 1024 frames holding 1000', '9 chunks (a first of 16 holding 8,
    then 2 of 16, ... and 3 of 256 frames)'."""
    if len(sp) == 1:
        return f"one chunk of {sp[0][1]} frames holding {sp[0][2]}"
    runs = [(L, sum(1 for _, M, n in sp if M == L and n == L)) for L in dict.fromkeys(L for _, L, _ in sp)]
    parts, (_, L, n) = [f"{k if k > 1 else 'one'} of {M}" for M, k in runs if k], sp[0]
    full = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]
    return f"{len(sp)} chunks (" + (f"a first of {L} holding {n}, then " if n < L else "") + f"{full} frames)"
