"""Experiment: does a nonlinear exit adapter beat the calibrated affine map at L/8 and L/4?

Held-out agreement of the exit's guess with the full model's greedy token, on the default model:
the affine map the ``calibrate`` command fits (ridge, then cross-entropy), against a residual
MLP adapter ``h -> h @ W + b + silu(norm(h) @ W1) @ W2`` (1024 hidden units, initialised from
the affine map, trained by cross-entropy over the same 8192-token vocabulary subset).
Data: 360 dev texts (first 256 tokens each) read teacher-forced; every fifth held out.
Run: ``python lab/scripts/hispec_exit_adapter.py >
lab/results/smollm2-135m-instruct/hispec-exit-adapter-zen4-avx512-2026-11-23/exit_adapter.txt``
(about 15 minutes on 2 cores).
"""

import time

import torch
from selfspec_hispec import calibrate as cal

from selfspec import Runner
from selfspec.app import load_model as load

HIDDEN, STEPS, BATCH = 1024, 3000, 512


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    loaded = load(None)
    runner = Runner(loaded.model)
    seqs = cal.dev_texts(loaded.tokenizer, {"sharegpt": 200, "humaneval": 60, "gsm8k": 100})
    data = cal.collect(runner, seqs, [4, 8])
    print("positions", data.targets.numel())
    counts = torch.bincount(data.targets, minlength=runner.vocab_size)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s), minlength=runner.vocab_size)[: runner.vocab_size]
    vocab = cal.top_vocab(counts, 8192)
    test = data.seq % 5 == 4
    train = ~test
    norm = runner.adapter.final_norm
    for p in norm.parameters():
        p.requires_grad_(False)
    emb = runner.model.get_output_embeddings().weight.detach().index_select(0, vocab).clone()
    pos = torch.full((runner.vocab_size,), -1, dtype=torch.long)
    pos[vocab] = torch.arange(vocab.numel())
    for layer in (4, 8):
        x, t = data.states[layer].clone(), data.targets
        (w0, b0), rep = cal.fit_layer(runner, data, layer, vocab, steps=1500)
        print(layer, "affine", {k: round(v, 3) for k, v in rep.items()})
        w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
        w1 = (torch.randn(x.shape[1], HIDDEN) * x.shape[1] ** -0.5).requires_grad_(True)
        w2 = torch.zeros(HIDDEN, x.shape[1]).requires_grad_(True)
        opt = torch.optim.Adam([w, b, w1, w2], lr=1e-3)
        tv = pos[t]
        keep = train & (tv >= 0)
        xtr, ttr = x[keep], tv[keep]
        mu, sd = xtr.mean(0), xtr.std(0) + 1e-3

        def adapter(h: torch.Tensor) -> torch.Tensor:
            return h @ w + b + torch.nn.functional.silu(((h - mu) / sd) @ w1) @ w2  # noqa: B023

        gen = torch.Generator().manual_seed(0)
        t0 = time.time()
        with torch.enable_grad():
            for step in range(STEPS):
                idx = torch.randint(0, xtr.shape[0], (BATCH,), generator=gen)
                loss = torch.nn.functional.cross_entropy(
                    (norm(adapter(xtr[idx])) @ emb.T).float(), ttr[idx]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 1000 == 999:
                    with torch.no_grad():
                        pred = vocab[(norm(adapter(x[test])) @ emb.T).argmax(-1)]
                        agree = float((pred == t[test]).float().mean())
                    print(
                        layer,
                        "mlp step",
                        step + 1,
                        "held-out agreement",
                        round(agree, 3),
                        round(time.time() - t0),
                        "s",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
