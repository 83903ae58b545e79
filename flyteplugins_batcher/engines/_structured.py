"""Structured output with `xgrammar`: checking a response format, and compiling it for a tokenizer.

`check_response_format` is the check every engine runs before a record reaches the model: the
schema, regex or grammar must convert to a grammar (tokenizer-independent, so it needs no model);
a choice becomes the grammar of its options, as vLLM writes it. `Grammars` compiles
each distinct format once for one tokenizer; `GrammarLogitsProcessor` (in `_grammar_processor`,
which imports torch) applies one matcher per batch row, or none, so records with and without a
format share one `generate` call.

Why compact JSON (no whitespace between tokens of the JSON, `COMPACT_SEPARATORS`): small models
given free whitespace tend to spend their token budget on newlines and indentation, or never leave
them; compact output is shorter and parses the same. vLLM's `disable_any_whitespace` writes the
same (`{"a":1,"b":[2,3]}`), so both engines answer a schema alike.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from typing import Any

from flyteplugins_batcher.engines import _install
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import InvalidResponseFormatError
from flyteplugins_batcher.engines._response_format import ResponseFormat

_SCHEMA_CHECK_CACHE_SIZE = 1024
"""Distinct schemas whose check result is kept: a batch file usually repeats a handful of schemas."""

_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")
"""xgrammar's C++ errors start with `[hh:mm:ss] path/to/file.cc:line: `."""

COMPACT_SEPARATORS = (",", ":")
"""What separates a JSON schema's items and keys from values: nothing more (vLLM's `disable_any_whitespace`)."""

STRUCTURED_OUTPUT_INSTALL = "pip install xgrammar (vLLM installs it; so does 'flyteplugins-batcher[transformers]')"


def check_generation(generation: GenerationConfig) -> None:
    """Fail when a record's settings ask for a response format whose schema cannot become a grammar.

    Raises:
        InvalidResponseFormatError: See `check_response_format`.
    """
    if generation.response_format is not None:
        check_response_format(generation.response_format)


def check_response_format(response_format: ResponseFormat) -> None:
    """Fail when `response_format` (its schema, regex, choice or grammar) cannot be turned into a grammar.

    Raises:
        InvalidResponseFormatError: Naming the format and what the grammar compiler said.
    """
    problem = _format_problem(*grammar_source(response_format))
    if problem is not None:
        raise InvalidResponseFormatError(f"{response_format.label} cannot be enforced: {problem}")


def grammar_source(response_format: ResponseFormat) -> tuple[str, str]:
    """What xgrammar compiles a format from: `("json", schema)`, `("regex", pattern)` or `("ebnf", grammar)`.

    A choice is the grammar of its options, each a quoted literal (as vLLM's xgrammar backend writes it).

    Example:
        ```python
        assert grammar_source(ResponseFormat.choice(["yes", "no"])) == ("ebnf", 'root ::= "yes" | "no"')
        ```
    """
    kind = response_format.kind
    if kind == "regex":
        return "regex", str(response_format.pattern)
    if kind == "grammar":
        return "ebnf", str(response_format.rules)
    if kind == "choice":
        literals = (_EBNF_SPECIAL.sub(r"\\\1", option) for option in response_format.options)
        return "ebnf", "root ::= " + " | ".join(f'"{literal}"' for literal in literals)
    return "json", response_format.grammar_schema


_EBNF_SPECIAL = re.compile(r'(["\\])')
"""What a quoted EBNF literal escapes."""


@functools.lru_cache(maxsize=_SCHEMA_CHECK_CACHE_SIZE)
def _format_problem(source: str, text: str) -> str | None:
    if _install.missing("xgrammar"):
        return f"structured output needs xgrammar, which is not installed ({STRUCTURED_OUTPUT_INSTALL})"
    import xgrammar as xgr

    try:
        if source == "json":
            xgr.Grammar.from_json_schema(text, any_whitespace=False, separators=COMPACT_SEPARATORS)
        elif source == "regex":
            xgr.Grammar.from_regex(text)
        else:
            xgr.Grammar.from_ebnf(text)
    except Exception as error:  # xgrammar reports schema problems as RuntimeError or ValueError
        return compiler_message(error)
    return None


def forced_token(matcher: Any, tokenizer: Any) -> int | None:
    """Where the grammar allows one text only, the tokenizer's first token of that text; else None.

    A schema's keys and punctuation are forced (`,"answer":` after a value, say). A model kept from
    the newline and indent it would write there picks whatever allowed token it likes best, often a
    piece of a key (`"`, `s`, `te`, `p`, `s`): compact JSON then costs more tokens than its text needs.
    A token shorter than this one there only splits the forced text more finely than the tokenizer
    would, so the processors (`GrammarLogitsProcessor`, vLLM's `ForcedTokens`) drop those
    (`without_shorter`): the model still chooses among the rest (this one, or a longer one running into
    what follows).

    Example:
        ```python
        matcher = grammars.matcher(ResponseFormat.json_schema(schema))  # {"steps": [...], "answer": ...}
        assert tokenizer.decode([forced_token(matcher, tokenizer)]) == '{"'  # the forced text is '{"steps":["'
        ```
    """
    forced = matcher.find_jump_forward_string()
    if not forced:
        return None
    tokens = tokenizer.encode(forced, add_special_tokens=False)
    return tokens[0] if tokens else None


def without_shorter(logits: Any, token_lengths: Any, token: int | None) -> Any:
    """One row of logits (a torch tensor) with the tokens shorter than `token` masked (`token_lengths`: a tensor
    of each token's length in bytes), when the grammar's mask kept `token` (so one is always left); else as it was.
    """
    width = min(logits.shape[-1], token_lengths.shape[0])
    if token is None or token >= width or logits[token].item() == float("-inf"):
        return logits
    kept = logits.clone()  # plain numbers below: a 0-d tensor in a comparison takes torch's slow path
    kept[:width].masked_fill_((token_lengths[:width] < int(token_lengths[token])).to(logits.device), float("-inf"))
    return kept


def compiler_message(error: BaseException) -> str:
    """xgrammar's complaint without the time stamp and C++ source location it starts with.

    Example:
        ```python
        # RuntimeError("[09:17:12] /project/cpp/json_schema_converter.cc:4944: Unsupported type \"strin\"")
        assert compiler_message(error) == 'Unsupported type "strin"'
        ```
    """
    text = " ".join(str(error).split())
    return _SOURCE_PREFIX.sub("", text) or type(error).__name__


class Grammars:
    """Compiled grammars for one tokenizer: each distinct response format is compiled once.

    The tokenizer's vocabulary is indexed on first use (a fraction of a second), so engines that
    never see a response format never pay for it. Thread-safe.

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: Width of the model's logits (may exceed the tokenizer's vocabulary).
        stop_token_ids: Tokens that end a sequence; a finished grammar allows only these.

    Example:
        ```python
        grammars = Grammars(tokenizer, model.config.vocab_size, stop_token_ids=[tokenizer.eos_token_id])
        processor = GrammarLogitsProcessor([grammars.matcher(ResponseFormat.json_object()), None], grammars.vocab_size)
        ```
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._compiled: dict[tuple[str, str], Any] = {}
        self._token_lengths: list[int] | None = None
        self._tokenizer_info: Any = None

    def compiled(self, response_format: ResponseFormat) -> Any:
        """The compiled grammar for a format (compiled on first use, then cached).

        Raises:
            InvalidResponseFormatError: The schema, regex or grammar does not compile.
        """
        source = grammar_source(response_format)
        with self._lock:
            cached = self._compiled.get(source)
            if cached is not None:
                return cached
            compiler = self._compiler or self._new_compiler()
            kind, text = source
            try:
                if kind == "json":
                    grammar = compiler.compile_json_schema(text, any_whitespace=False, separators=COMPACT_SEPARATORS)
                elif kind == "regex":
                    grammar = compiler.compile_regex(text)
                else:
                    grammar = compiler.compile_grammar(text)
            except Exception as error:
                message = f"{response_format.label} cannot be enforced: {compiler_message(error)}"
                raise InvalidResponseFormatError(message) from error
            self._compiled[source] = grammar
            return grammar

    def matcher(self, response_format: ResponseFormat) -> Any:
        """A fresh matcher (one per generated sequence) for a format."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compiled(response_format))

    @property
    def token_lengths(self) -> list[int]:
        """Each token's length in bytes, as the grammar reads it (`vocab_size` of them; 0 past the vocabulary)."""
        if self._token_lengths is None:
            with self._lock:
                if self._compiler is None:
                    self._new_compiler()
            lengths = [len(text) for text in self._tokenizer_info.decoded_vocab]
            self._token_lengths = (lengths + [0] * self.vocab_size)[: self.vocab_size]
        return self._token_lengths

    def _new_compiler(self) -> Any:
        _install.require("structured-output", ("xgrammar",), STRUCTURED_OUTPUT_INSTALL)
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        self._tokenizer_info = info
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # we cache by schema ourselves
        return self._compiler
