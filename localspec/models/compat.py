"""Can a draft model speculate for a target? The tokenizer rule llama.cpp itself applies.

This mirrors `common_speculative_are_compatible` in llama.cpp's common/speculative.cpp:
the same vocab type; the same add-BOS setting and, when BOS is added, the same BOS id
(likewise EOS); vocabulary sizes within 128 tokens; and identical token texts from
id 5 up to the smaller vocabulary. `compare_vocabs` is pure; `check_compat` feeds it
from two GGUF files' metadata (never their weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import TokenizerMismatchError
from localspec.models.gguf_info import GGUFInfo, llama_vocab_type, read_tokens

# Named as in llama.cpp's common/speculative.cpp.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True)
class Vocab:
    """What the compatibility rule looks at in one model's tokenizer."""

    vocab_type: str
    add_bos: bool
    bos_id: int | None
    add_eos: bool
    eos_id: int | None
    tokens: Sequence[str]


@dataclass(frozen=True)
class CompatResult:
    """The verdict; `reason` names the first rule the pair breaks (None when compatible)."""

    compatible: bool
    reason: str | None = None

    def raise_if_incompatible(self, target: str, draft: str) -> None:
        """Raise TokenizerMismatchError naming both models when the pair cannot speculate."""
        if not self.compatible:
            raise TokenizerMismatchError(
                f"draft {draft} cannot speculate for target {target}: {self.reason}",
                param="draft",
            )


COMPATIBLE = CompatResult(True)


def compare_vocabs(target: Vocab, draft: Vocab) -> CompatResult:
    """Apply llama.cpp's rule to two vocabularies, reporting the first difference found."""
    t_type, d_type = llama_vocab_type(target.vocab_type), llama_vocab_type(draft.vocab_type)
    if t_type != d_type:
        return CompatResult(False, f"vocab types differ ({target.vocab_type} vs {draft.vocab_type})")
    special = _special_mismatch("BOS", target.add_bos, target.bos_id, draft.add_bos, draft.bos_id)
    special = special or _special_mismatch("EOS", target.add_eos, target.eos_id, draft.add_eos, draft.eos_id)
    if special:
        return CompatResult(False, special)
    n_target, n_draft = len(target.tokens), len(draft.tokens)
    diff = abs(n_target - n_draft)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return CompatResult(
            False,
            f"vocab sizes differ by {diff} ({n_target} vs {n_draft}), "
            f"more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}",
        )
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(n_target, n_draft)):
        if target.tokens[i] != draft.tokens[i]:
            return CompatResult(False, f"token {i}: {target.tokens[i]!r} vs {draft.tokens[i]!r}")
    return COMPATIBLE


def _special_mismatch(what: str, t_add: bool, t_id: int | None, d_add: bool, d_id: int | None) -> str | None:
    if t_add != d_add:
        return f"one adds {what} and the other does not (target {_onoff(t_add)}, draft {_onoff(d_add)})"
    # The ids only matter when the token is actually inserted into prompts.
    if t_add and t_id != d_id:
        return f"{what} ids differ ({t_id} vs {d_id})"
    return None


def _onoff(flag: bool) -> str:
    return "on" if flag else "off"


def vocab_of(info: GGUFInfo, *, cache_dir: Path | None = None) -> Vocab:
    """The compatibility view of a model file (token texts come from the on-disk cache)."""
    return Vocab(
        vocab_type=info.vocab_type,
        add_bos=info.add_bos,
        bos_id=info.bos_id,
        add_eos=info.add_eos,
        eos_id=info.eos_id,
        tokens=read_tokens(info, cache_dir=cache_dir),
    )


def check_compat(target: GGUFInfo, draft: GGUFInfo, *, cache_dir: Path | None = None) -> CompatResult:
    """Whether `draft` can speculate for `target` by llama.cpp's rule."""
    # The fingerprint hashes every input of the rule, so equal ones settle it without token lists.
    if target.tokenizer_fingerprint == draft.tokenizer_fingerprint:
        return COMPATIBLE
    return compare_vocabs(vocab_of(target, cache_dir=cache_dir), vocab_of(draft, cache_dir=cache_dir))
