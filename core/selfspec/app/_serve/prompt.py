"""Prompts to token ids, off the event loop, bounded before any tokenizing.

:class:`PromptEncoder` owns a copy of the model's tokenizer and one thread of its own: the
decode thread keeps the original, and the event loop only awaits. Before it tokenizes, a prompt
whose text is longer in UTF-8 than ``max_prompt_tokens`` times the longest token's bytes is
refused (it cannot fit: every token covers at most that many bytes), so the tokenizer never
sees more than that. Special tokens typed into chat message content are text by default (the
chat template's own special tokens stay special), so a user cannot forge a turn.
"""

from __future__ import annotations

import asyncio
import copy
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from selfspec.app._serve.protocol import ApiError, Limits, Request


class PromptEncoder:
    """Encodes a :class:`Request`'s prompt (``encode``, awaited on the event loop) with
    ``tokenizer``; ``specials_as_text``: special tokens in message content are text."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        limits: Limits,
        specials_as_text: bool = True,
        model_id: str | None = None,
    ) -> None:
        self._source = tokenizer
        self.vocab_size = vocab_size
        self.limits = limits
        self.specials_as_text = specials_as_text
        self.model_id = model_id
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="selfspec-encode")
        self._tok: Any = None
        self.max_token_bytes = 0
        self._specials: list[str] = []
        self._special_re: re.Pattern[str] | None = None

    async def encode(self, req: Request) -> list[int]:
        """The prompt's token ids (the chat template for chat); 400 when it cannot fit."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.encode_now, req)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------ encode thread
    def encode_now(self, req: Request) -> list[int]:
        """:meth:`encode` on the calling thread (the encoder's own, or a test's)."""
        self._prepare()
        param = "messages" if req.kind == "chat" else "prompt"
        if req.kind == "chat":
            self._bound_text([m["content"] for m in req.messages], param)
            ids = self._chat(req.messages)
        elif isinstance(req.prompt, str):
            self._bound_text([req.prompt], param)
            ids = list(self._tok.encode(req.prompt))
        else:
            ids = list(req.prompt or [])
            self._bound_count(len(ids), param)
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise ApiError(
                    400, f"prompt token ids must lie in [0, {self.vocab_size})", "prompt"
                )
        ids = [int(i) for i in ids]
        if not ids:
            raise ApiError(400, "the prompt encodes to no tokens", param)
        self._bound_count(len(ids), param)
        return ids

    def _prepare(self) -> None:
        if self._tok is not None:
            return
        tok = copy.deepcopy(
            self._source
        )  # the decode thread's tokenizer is never shared with this one
        # every token covers at most its vocabulary string's UTF-8 bytes (a byte-level or
        # SentencePiece symbol stands for one byte and takes at least one)
        self.max_token_bytes = (
            max((len(t.encode("utf-8")) for t in tok.get_vocab()), default=1) or 1
        )
        decoder = getattr(tok, "added_tokens_decoder", {}) or {}
        specials = {
            t.content for t in decoder.values() if getattr(t, "special", False) and t.content
        }
        self._specials = sorted(specials, key=len, reverse=True)
        if self._specials:
            self._special_re = re.compile("|".join(re.escape(s) for s in self._specials))
        self._tok = tok

    def _bound_text(self, texts: list[str], param: str) -> None:
        """A 400 when ``texts`` cannot fit in ``max_prompt_tokens`` tokens, measured without
        tokenizing (characters first: a character is at least one UTF-8 byte)."""
        bound = self.limits.max_prompt_tokens * self.max_token_bytes
        if (
            sum(len(t) for t in texts) > bound
            or sum(len(t.encode("utf-8", "replace")) for t in texts) > bound
        ):
            raise ApiError(
                400,
                "the prompt is too long: this server takes at most "
                f"{self.limits.max_prompt_tokens} tokens, and its text is longer than that many "
                f"tokens can be ({bound} UTF-8 bytes)",
                param,
                code="context_length_exceeded",
            )

    def _bound_count(self, n: int, param: str) -> None:
        if n > self.limits.max_prompt_tokens:
            raise ApiError(
                400,
                f"the prompt is {n} tokens; this server takes at most "
                f"{self.limits.max_prompt_tokens}",
                param,
                code="context_length_exceeded",
            )

    def _chat(self, messages: list[dict[str, str]]) -> list[int]:
        tok = self._tok
        if not getattr(tok, "chat_template", None):
            raise ApiError(
                400,
                f"the model {self.model_id!r} has no chat template: use /v1/completions",
                "messages",
            )
        pattern = self._special_re
        forged = (
            self.specials_as_text
            and pattern is not None
            and any(pattern.search(m["content"]) for m in messages)
        )
        try:
            if not forged:
                ids = tok.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
                if hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                ids = list(ids)
                return ids[0] if ids and isinstance(ids[0], list) else ids
            return self._chat_specials_as_text(messages)
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001  (a template that rejects the conversation)
            raise ApiError(
                400, f"the chat template rejects these messages: {_one_line(exc)}", "messages"
            ) from None

    def _chat_specials_as_text(self, messages: list[dict[str, str]]) -> list[int]:
        """The template's special tokens as tokens, those typed into content as text.

        Each special-token string in content is swapped for a unique placeholder, the template
        renders, the text is cut at the special tokens left (the template's own), and each piece
        between them is tokenized with the placeholders swapped back and special tokens read as
        text. The tokenizer cuts its input at special tokens before anything else, so a
        conversation without special-token strings in its content gets the same ids either way.
        """
        tok, pattern = self._tok, self._special_re
        assert pattern is not None
        nonce = secrets.token_hex(8)
        hidden: dict[str, str] = {}

        def hide(m: re.Match[str]) -> str:
            key = f"\ue000{nonce}:{len(hidden)}\ue001"
            hidden[key] = m[0]
            return key

        rendered = tok.apply_chat_template(
            [{**m, "content": pattern.sub(hide, m["content"])} for m in messages],
            add_generation_prompt=True,
            tokenize=False,
        )
        placeholder = re.compile(f"\ue000{nonce}:\\d+\ue001")
        ids: list[int] = []
        for i, piece in enumerate(_split_keep(pattern, rendered)):
            if i % 2:
                ids.append(int(tok.convert_tokens_to_ids(piece)))
            elif piece:
                text = placeholder.sub(lambda m: hidden[m[0]], piece)
                ids.extend(
                    tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                )
        return ids


def _split_keep(pattern: re.Pattern[str], text: str) -> list[str]:
    """``text`` cut at ``pattern``'s matches: text, match, text, ..., text."""
    out, at = [], 0
    for m in pattern.finditer(text):
        out += [text[at : m.start()], m[0]]
        at = m.end()
    out.append(text[at:])
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
