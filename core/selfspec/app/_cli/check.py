"""``specdec check``: a plugin's output against plain greedy decoding (or plain sampling with the
same seed) on real prompts."""

from __future__ import annotations

import json
from typing import Any

import click

from selfspec.app._cli.group import _model_options, _sampling_options, cli
from selfspec.app._cli.settings import (
    CHECK_LONG_NEW,
    CHECK_LONG_PROMPT,
    CHECK_MAX_NEW_TOKENS,
    DEFAULT_CHECK_PROMPTS,
    BadInput,
    Settings,
    placement_record,
    user_errors,
)


@cli.command("check")
@_model_options
@_sampling_options
@click.option(
    "--prompt",
    "prompts",
    multiple=True,
    help="A prompt to check (repeatable; default: a few built-in ones).",
)
@click.option(
    "--max-new-tokens",
    "-n",
    type=click.IntRange(min=0),
    default=None,
    help=f"Token budget per prompt (default {CHECK_MAX_NEW_TOKENS}).",
)
@click.option(
    "--chat/--no-chat", default=None, help="Apply the chat template (default: instruct models)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of lines.")
@click.option(
    "--audit",
    is_flag=True,
    help="Also check every step against the full model and name the hook at fault.",
)
@click.option(
    "--long/--no-long",
    "long",
    default=None,
    help=f"Also decode one long example without EOS: a prompt of {CHECK_LONG_PROMPT}+ tokens and "
    f"{CHECK_LONG_NEW} new tokens, the kit's long examples (default: on unless --prompt or "
    f"--max-new-tokens is given).",
)
@click.pass_context
def check_command(
    ctx: click.Context,
    prompts: tuple[str, ...],
    as_json: bool,
    audit: bool,
    long: bool | None,
    **params: Any,
) -> None:
    """Compare a plugin's output with plain greedy decoding (model.generate), or with
    plain sampling under the same seed when --temperature is above 0. With --exact, compare
    with `vanilla --exact` instead, bit for bit (OK or DIVERGED: no near-tie rule).

    Prints OK, NEAR-TIE (a float32/bf16 rounding flip: the reference's top-1/top-2 logit
    margin is within the dtype's near-tie bound at those logits,
    selfspec._engine.contract.tiebound) or DIVERGED for every prompt; exits with status 1 when
    any prompt diverged. Under sampling the reference is the model's own forward one token at a
    time, each token picked with the same position-keyed noise, and the near-tie margin is that of
    the perturbed logits (bound / T).
    ``--audit`` (or ``SELFSPEC_AUDIT=1``) stops a decode at the step where it goes wrong and
    says which hook, step and token (``selfspec._engine.contract.audit``).

    By default one more decode runs past where short prompts stop: the built-in prompts
    repeated into a long prompt, and a long output with no EOS, where late bugs show. The
    summary says how long the prompts and outputs checked were: a bug past them is not seen.
    """
    from selfspec._engine.contract.audit import AuditError
    from selfspec._engine.contract.reference import compare
    from selfspec._engine.contract.sampling import reference_sample
    from selfspec._engine.contract.tiebound import FIXED_BOUND, explain

    settings: Settings = ctx.obj.merged(params)
    texts = list(prompts) or list(DEFAULT_CHECK_PROMPTS)
    if any(not t.strip() for t in texts):
        raise BadInput("the prompt is empty")
    max_new = (
        settings.max_new_tokens if settings.max_new_tokens is not None else CHECK_MAX_NEW_TOKENS
    )
    if long is None:  # the default run reaches the kit's long examples; a chosen one is the user's
        long = not prompts and settings.max_new_tokens is None
    rows: list[dict[str, Any]] = []
    with user_errors():
        from selfspec.app import _models as models

        settings.validate_model_args()
        settings.validate_plugin()
        loaded = settings.load_model()
        decoder = settings.decoder(loaded)
        decoder.audit = decoder.audit or audit
        tolerance = FIXED_BOUND.get(loaded.dtype)  # None: scales with the logits (bf16/fp16)
        sampling = decoder.sampling
        reference = _exact_reference(loaded, decoder) if settings.exact else None
        cases = [
            (text, models.format_prompt(loaded, text), max_new, loaded.eos_token_ids)
            for text in texts
        ]
        if long:
            cases.append(_long_case(loaded, texts))
        seen = (0, 0)  # the longest prompt and output checked
        for i, (text, ids, max_new, eos) in enumerate(cases, 1):
            try:
                result = decoder.generate(ids, max_new, eos)
            except AuditError as exc:
                rows.append({"prompt": text, "status": "DIVERGED", "audit": str(exc)})
                if not as_json:
                    click.echo(f"DIVERGED  [{i}] {text!r}: {exc}")
                continue
            if reference is not None:  # exact mode: vanilla --exact, bit for bit, no near-tie rule
                ref = reference.generate(ids, max_new, eos).output_ids
                c = compare(loaded.model, ids, result.output_ids, ref, sampling=sampling)
                status = "OK" if c.equal else "DIVERGED"
            else:
                ref = reference_sample(loaded.model, ids, max_new, eos, sampling)
                c = compare(loaded.model, ids, result.output_ids, ref, sampling=sampling)
                status = "OK" if c.equal else "NEAR-TIE" if c.near_tie else "DIVERGED"
            row: dict[str, Any] = {
                "prompt": text,
                "status": status,
                "tokens": len(result.output_ids),
                "tau": result.stats.tau,
                "index": c.index,
                "margin": c.margin,
            }
            if not c.equal:
                row["got"] = (
                    result.output_ids[c.index] if c.index < len(result.output_ids) else None
                )
                row["expected"] = ref[c.index] if c.index < len(ref) else None
                row["bound"] = c.bound
                row["why"] = explain(loaded.dtype, c.margin, c.bound)
            rows.append(row)
            seen = (max(seen[0], len(ids)), max(seen[1], len(result.output_ids)))
            if not as_json:
                click.echo(_check_line(i, row))
    diverged = sum(r["status"] == "DIVERGED" for r in rows)
    near = sum(r["status"] == "NEAR-TIE" for r in rows)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "plugin": decoder.plugin_name,
                    "model": loaded.name,
                    "exact": bool(settings.exact),
                    "dtype": str(loaded.dtype).removeprefix("torch."),
                    "tolerance": tolerance,
                    "sampling": sampling.as_dict(),
                    "placement": placement_record(loaded),
                    **settings.thread_choice.as_dict(),
                    "checked_prompt_tokens": seen[0],
                    "checked_new_tokens": seen[1],
                    "results": rows,
                },
                indent=2,
            )
        )
    else:
        how = (
            ""
            if sampling.greedy
            else (
                f", T={sampling.temperature:g} top-k={sampling.top_k} "
                f"top-p={sampling.top_p:g} seed={sampling.seed}"
            )
        )
        click.echo(
            f"{decoder.plugin_name} on {loaded.name} "
            f"({str(loaded.dtype).removeprefix('torch.')}{how}): "
            f"{len(rows) - near - diverged} OK, {near} near-tie, {diverged} diverged"
        )
        click.echo(_reach_line(*seen, long))
    if diverged:
        ctx.exit(1)


def _long_case(loaded: Any, texts: list[str]) -> tuple[str, list[int], int, tuple[int, ...]]:
    """The long example: ``texts`` repeated into a prompt of ``CHECK_LONG_PROMPT`` tokens or
    more and ``CHECK_LONG_NEW`` new tokens without EOS (a model with fewer positions gets half
    of them for each, the prompt's end kept),
    so the decode runs to its budget as the kit's long examples do."""
    from selfspec.app import _models as models

    text = " ".join(texts)
    ids = models.format_prompt(loaded, text)
    while len(ids) < CHECK_LONG_PROMPT:
        text = f"{text} {' '.join(texts)}"
        ids = models.format_prompt(loaded, text)
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    new = CHECK_LONG_NEW
    if limit is not None and len(ids) + new > int(limit):  # a small model: half its positions each
        new = max(1, min(new, int(limit) // 2))
        ids = ids[
            len(ids) + new - int(limit) :
        ]  # the prompt's end (the template's answer turn) kept
    return (
        f"(long: the prompts repeated, {len(ids)} tokens, {new} new tokens, no EOS)",
        ids,
        new,
        (),
    )


def _reach_line(prompt_tokens: int, new_tokens: int, long: bool) -> str:
    """What the run could see: the longest prompt and output checked; a bug past them is not."""
    more = "" if long else "; the default run adds a long example (--long)"
    return (
        f"checked prompts up to {prompt_tokens} tokens and outputs up to {new_tokens} new tokens: "
        f"a bug that starts later is not seen here{more}; the kit's suite reaches further "
        "(docs/testing-plugins.md)"
    )


def _exact_reference(loaded: Any, decoder: Any) -> Any:
    """``vanilla`` in exact mode with the decoder's layout and sampling: the reference every
    exact-mode output must equal bit for bit."""
    from selfspec._engine.contract.loop import Decoder

    return Decoder(
        loaded.model,
        "vanilla",
        tokenizer=loaded.tokenizer,
        weight_layout=decoder.runner.weight_layout,
        sampling=decoder.sampling,
        exact=True,
    )


def _check_line(i: int, row: dict[str, Any]) -> str:
    head = f"{row['status']:<8}  [{i}] {row['prompt']!r}"
    if row["status"] == "OK":
        return f"{head}: {row['tokens']} tokens identical (tau {row['tau']:.2f})"
    return (
        f"{head}: first difference at new token {row['index']}: got {row['got']}, expected "
        f"{row['expected']}; reference top-1/top-2 {row['why']}"
    )
