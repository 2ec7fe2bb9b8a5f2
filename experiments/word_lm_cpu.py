"""Experiment: an ordinary word-level language model written for torch.nn.LSTM, trained on the CPU with
torch.nn.LSTM and with rnngraph.torch.LSTM swapped in (the numpy reference engine, and the compiled cpu one):
the same model, data, initial weights and plain SGD, one epoch each, in one process.

The model: word embedding (the bundled Shakespeare, lower-cased, its most frequent words, the rest <unk>),
an LSTM of 2 layers, a linear decoder, cross-entropy; batch 20 streams, BPTT 35, SGD with gradient clipping,
states carried (detached) across windows. Prints seconds per epoch and the loss curve's ends, which match
between the engines (the same arithmetic up to rounding order). A measurement, not a test:

    python experiments/word_lm_cpu.py [--hidden 128] [--vocab 10000] [--batches 0 (the whole epoch)]
                                      [--torch-threads N] (OPENBLAS_NUM_THREADS=N sets numpy's BLAS threads)
                                      [--json FILE] (the machine, settings and each engine's epoch, which
                                      docs/performance.md reads from results/bench/word_lm.json)
"""
import argparse
import functools
import json
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not


def corpus(vocab: int):
    """(token ids [N] int64, vocabulary size): the bundled Shakespeare as lower-cased words."""
    import torch
    from rnngraph.train.data import read_text
    words = re.findall(r"[a-z']+|[.,;:!?]", read_text().lower())
    keep = {w: k + 1 for k, (w, _) in enumerate(Counter(words).most_common(vocab - 1))}    # 0: <unk>
    return torch.tensor([keep.get(w, 0) for w in words]), vocab


def model(lstm_cls, V: int, H: int, layers: int):
    import torch

    class WordLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.out = torch.nn.Embedding(V, H), lstm_cls(H, H, layers), torch.nn.Linear(H, V)

        def forward(self, x, state):
            y, state = self.rnn(self.embed(x), state)
            return self.out(y), state
    torch.manual_seed(0)
    return WordLM()


def epoch(net, data, bptt: int, batch: int, lr: float, batches: int) -> tuple:
    """(seconds, losses): one pass over data as `batch` streams, windows of `bptt` tokens."""
    import torch
    streams = data[:len(data) // batch * batch].view(batch, -1).t().contiguous()     # [N / batch, batch]
    opt, losses, state = torch.optim.SGD(net.parameters(), lr=lr), [], None
    starts = list(range(0, streams.shape[0] - 1, bptt))[:batches or None]
    t0 = time.perf_counter()
    for i in starts:
        x, y = streams[i:i + bptt], streams[i + 1:i + 1 + bptt]
        x = x[:len(y)]
        if state is not None:
            state = tuple(s.detach() for s in state)
        logits, state = net(x, state)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.25)
        opt.step()
        losses.append(loss.item())
    return time.perf_counter() - t0, losses


def rnngraph_lstm(backend: str):
    """rnngraph.torch.LSTM with its CPU engine on `backend`: 'cpu' is what it ships (the compiled backend where numba
    runs, its BLAS on one thread beside torch's pool); 'numpy' holds it to the numpy reference engine."""
    import rnngraph.torch as rt
    from rnngraph.run.backends import get_backend
    from rnngraph.torch import modules
    if backend == "cpu":
        return rt.LSTM
    host = modules._host_backend

    class NumpyLSTM(rt.LSTM):
        def _engine(self, *args):
            modules._host_backend = functools.partial(get_backend, backend)     # for this call only
            try:
                return super()._engine(*args)
            finally:
                modules._host_backend = host
    return NumpyLSTM


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--bptt", type=int, default=35)
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--batches", type=int, default=0, help="windows per epoch (0: the whole corpus)")
    ap.add_argument("--engines", default="torch,rnngraph_cpu,rnngraph_numpy")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--json", metavar="FILE", help="also write the machine, the settings and each engine's epoch here")
    args = ap.parse_args(argv)
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    from rnngraph.lab.bench import machine_info
    data, V = corpus(args.vocab)
    info = machine_info()
    print(f"word LM: {len(data)} tokens, vocab {V}, {args.layers} × LSTM({args.hidden}), batch {args.batch}, "
          f"bptt {args.bptt}, SGD lr {args.lr}; {info['device']}; {info.get('cpu')}")
    classes = {"torch": torch.nn.LSTM, "rnngraph_cpu": rnngraph_lstm("cpu"), "rnngraph_numpy": rnngraph_lstm("numpy")}
    runs = {}
    for name in args.engines.split(","):
        net = model(classes[name], V, args.hidden, args.layers)
        epoch(net, data, args.bptt, args.batch, args.lr, 2)           # first calls: kernels, workspaces
        net = model(classes[name], V, args.hidden, args.layers)       # the same initial weights again
        runs[name] = epoch(net, data, args.bptt, args.batch, args.lr, args.batches)
        s, losses = runs[name]
        print(f"{name:>15}: {s:7.2f} s/epoch ({len(losses)} windows, {1e3 * s / len(losses):.1f} ms each); loss "
              f"{losses[0]:.4f} -> {statistics.mean(losses[-20:]):.4f} (mean of the last 20)", flush=True)
    if "torch" in runs:
        for name, (s, _) in runs.items():
            if name != "torch":
                print(f"{name} / torch: {s / runs['torch'][0]:.2f}x")
    if args.json:
        results = [{"engine": name, "s_per_epoch": s, "windows": len(losses), "ms_per_window": 1e3 * s / len(losses),
                    "first_loss": losses[0], "last_loss": statistics.mean(losses[-20:])}
                   for name, (s, losses) in runs.items()]
        doc = {"machine": info, "settings": dict(vars(args), tokens=len(data)), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
