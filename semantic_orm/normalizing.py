"""Text normalisation declared on a column: what the embedder and the keyword analyser read.

``SemanticText(normalize=("nfkc", "t2s"))`` names steps applied, in order, to every chunk before
it is embedded and analysed, and to every query before it is embedded and analysed, so a
document and a query written differently meet in the same form. The stored text, the chunks and
their offsets never change: ``hit.chunk.text`` and ``hit.highlight()`` show the row's own text.

Steps:

* ``"nfkc"`` (the default): Unicode compatibility folding: full-width Latin letters and digits
  (``ＡＢＣ１２３``) become ``ABC123``, ligatures and compatibility forms their plain letters.
  Measured with all-MiniLM-L6-v2 on XQuAD-zh, it lifts dense MRR@5 from 0.093 to 0.155 (the model
  reads full-width digits once they are ASCII).
* ``"t2s"``: Traditional to Simplified Chinese with OpenCC (``pip install
  'semantic-orm[chinese]'``), for a model or analyser trained on Simplified text: a query in one
  script then finds text in the other. Not a default: with the default character-bigram analyser
  it changes nothing measured, and it slightly lowers MiniLM's dense score on Traditional text.
* ``"lower"``: case folding (``str.casefold``), for a cased model that should ignore case.
* ``"accents"``: strip combining accents from Latin, Greek and Cyrillic letters
  (``évaluation`` -> ``evaluation``), for a model that should ignore them. Marks of other
  scripts (Thai, Devanagari vowel signs, Arabic harakat) are letters there, and are kept.

The steps are part of the column's recorded settings: changing them is drift, rebuilt with
``semantic-orm rebuild``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, Final

from .exc import ConfigurationError, MissingDependencyError
from .forking import RenewedLock

__all__ = [
    "DEFAULT_NORMALIZE",
    "LANGUAGES",
    "NORMALIZE_STEPS",
    "Normalizer",
    "check_language",
    "check_steps",
]

NORMALIZE_STEPS: Final = ("nfkc", "t2s", "lower", "accents")
"""The step names ``SemanticText(normalize=...)`` accepts."""
DEFAULT_NORMALIZE: Final = ("nfkc",)

_opencc: Any = None
_opencc_lock = RenewedLock()


def _t2s(text: str) -> str:
    global _opencc
    if _opencc is None:
        with _opencc_lock:
            if _opencc is None:
                try:
                    import opencc
                except ImportError as exc:
                    raise MissingDependencyError(
                        "SemanticText(normalize=('t2s',)) needs OpenCC: "
                        "pip install 'semantic-orm[chinese]'"
                    ) from exc
                _opencc = opencc.OpenCC("t2s")
    converted: str = _opencc.convert(text)
    return converted


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _lower(text: str) -> str:
    return text.casefold()


def _foldable(ch: str) -> bool:
    """Whether ``ch``'s accents may be stripped: a Latin, Greek or Cyrillic letter."""
    return ch < "\u0530"  # Latin (with its extensions), IPA, Greek and Cyrillic blocks


def _accents(text: str) -> str:
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", text):
        if unicodedata.combining(ch) and out and _foldable(out[-1]):
            continue
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


_STEPS: Final[dict[str, Callable[[str], str]]] = {
    "nfkc": _nfkc,
    "t2s": _t2s,
    "lower": _lower,
    "accents": _accents,
}


def check_steps(steps: Any, where: str = "SemanticText(normalize=...)") -> tuple[str, ...]:
    """``steps`` as a tuple of known step names.

    Raises:
        ConfigurationError: Not a sequence of names, an unknown or repeated name.
    """
    if steps is None:
        return ()
    names = (steps,) if isinstance(steps, str) else steps
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"{where} takes step names, got {steps!r}")
    unknown = [n for n in names if n not in _STEPS]
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown step(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(NORMALIZE_STEPS)}"
        )
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{where} repeats a step: {steps!r}")
    return tuple(names)


class Normalizer:
    """The steps of one column, applied in order (see the module docstring).

    Args:
        steps: Step names from :data:`NORMALIZE_STEPS`; empty: texts pass unchanged.
    """

    def __init__(self, steps: Sequence[str] = DEFAULT_NORMALIZE) -> None:
        self.steps = check_steps(tuple(steps), "Normalizer")
        self._chain = [_STEPS[name] for name in self.steps]

    def __repr__(self) -> str:
        return f"Normalizer({self.steps!r})"

    def __call__(self, text: str) -> str:
        """``text`` after every step."""
        for step in self._chain:
            text = step(text)
        return text


LANGUAGES: Final[dict[str, str]] = {
    name.lower(): name
    for name in (
        "Arabic", "Armenian", "Danish", "Dutch", "English", "Finnish", "French", "German",
        "Greek", "Hungarian", "Italian", "Norwegian", "Portuguese", "Romanian", "Russian",
        "Spanish", "Swedish", "Tamil", "Turkish",
    )
}  # fmt: skip
"""The languages keyword search can stem (Qdrant's Snowball stemmers), lower-case name: name."""
_CODES: Final[dict[str, str]] = {
    "ar": "arabic", "da": "danish", "de": "german", "el": "greek", "en": "english",
    "es": "spanish", "fi": "finnish", "fr": "french", "hu": "hungarian", "hy": "armenian",
    "it": "italian", "nl": "dutch", "no": "norwegian", "pt": "portuguese", "ro": "romanian",
    "ru": "russian", "sv": "swedish", "ta": "tamil", "tr": "turkish",
}  # fmt: skip


def check_language(language: Any, where: str = "SemanticText(language=...)") -> str | None:
    """``language`` as a lower-case name from :data:`LANGUAGES` (a name or ISO 639-1 code).

    Raises:
        ConfigurationError: Not a string, or a language without a stemmer.
    """
    if language is None:
        return None
    if not isinstance(language, str):
        raise ConfigurationError(f"{where} takes a language name or code, got {language!r}")
    key = language.strip().lower()
    key = _CODES.get(key, key)
    if key not in LANGUAGES:
        raise ConfigurationError(
            f"{where}: no stemmer for {language!r}; known: {', '.join(LANGUAGES)} (or their "
            "ISO 639-1 codes); None for the language-independent analyser"
        )
    return key
