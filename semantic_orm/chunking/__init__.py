"""Split text into overlapping, offset-exact chunks ready for embedding.

What a chunk is
---------------
Embedding models accept a bounded amount of text, and retrieval works best when each vector
describes one coherent passage. A :class:`Chunk` is such a passage: a contiguous slice of the
original document plus its position (``index`` out of ``total_chunks``) and its character
offsets.

The offset guarantee
--------------------
Offsets count Unicode code points, i.e. they are ordinary Python ``str`` indices into the
*original*, unmodified text, and for every chunk::

    original[chunk.start_offset:chunk.end_offset] == chunk.text

Chunkers never edit text: trimming whitespace, snapping to character boundaries and adding
overlap are all done by moving offsets. This lets callers highlight a hit in the source
document, or re-derive a chunk's text from the stored document, with no fuzzy searching.

Every offset also falls on an *extended grapheme cluster* boundary (what a reader perceives as
one character): a chunk never separates ``e`` from a following combining accent, never cuts a
ZWJ emoji sequence such as ``👩\u200d👩\u200d👧``, a flag (regional-indicator pair), an emoji
with its skin-tone modifier or variation selector, or a ``\\r\\n`` pair. The one exception is a
single grapheme cluster longer than ``chunk_size`` (for example a base letter followed by
thousands of combining marks): since no boundary exists inside it, it is hard-cut so that the
size limit still holds.

Strategies
----------
Three strategies are registered by name, so a column picks one with
``SemanticText(chunker="sentence")`` or code calls ``get_chunker("hybrid", chunk_size=800,
overlap=100)``. All share the guarantees above, are deterministic and run in time linear in
the document length.

``"recursive"`` (:class:`RecursiveChunker`, the default of :func:`get_chunker`)
    LangChain-style separator hierarchy (paragraph, line, sentence, word, grapheme) walked
    with a cursor: the fastest, and a good fit for arbitrary text. Overlap starts at the
    earliest paragraph/line/sentence/word start within ``overlap`` characters.
``"sentence"`` (:class:`SentenceChunker`)
    Multilingual sentence segmentation (abbreviation-aware for French and English, CJK
    terminators without spaces, closing quotes kept), then greedy packing of whole
    sentences; overlap is made of whole trailing sentences. Chunks end at real sentence ends,
    which matters most for Chinese and Japanese. See :mod:`.sentence`.
``"hybrid"`` (:class:`HybridChunker`, the default of ``SemanticText()``)
    Sections (headings such as ``# …``, ``第N回``, ``Chapter …``), then paragraphs, then
    sentence windows only inside over-long paragraphs; chunks never cross a section and carry
    ``section``/``section_index``/``paragraph``/``segment`` metadata. Optional boilerplate
    cleaning moves chunk starts. See :mod:`.hybrid`.

Structure tags
--------------
:class:`TaggingChunker` wraps any chunker and adds a ``type`` to each chunk's metadata
(``"title"``, ``"verse"``, ``"boilerplate"`` or ``"text"``) plus the section and paragraph it
starts in, which search can filter and de-duplicate on; ``SemanticText(tags=True)`` turns it on
for a column. See :mod:`.structure`.

Custom strategies plug in with :func:`register_chunker`; invalid settings (``chunk_size <= 0``,
``overlap < 0``, ``overlap >= chunk_size``, an unknown name) raise ``ValueError`` naming the
setting.

Fitting the model window
------------------------
Sizes are in characters, but models read tokens. :func:`fit_to_window` splits any chunk with
too many tokens further, at token boundaries mapped back to exact character offsets. For the
default model (all-MiniLM-L6-v2, 254 content tokens) ``SemanticText()``'s ``chunk_size=900``
leaves 0.14 % of English chunks over the window (French needs ~700 characters, CJK always needs the
second split); see :mod:`.fit` for the measurements.

Package layout
--------------
``_core`` (types, protocols, grapheme helpers, separator levels), ``recursive``,
``sentence``, ``hybrid``, ``structure``, ``fit`` and ``registry``; everything public is
re-exported here.
"""

from __future__ import annotations

from ._core import Chunk, Chunker, ChunkerFactory
from .fit import (
    TokenSpans,
    encoding_lock,
    fit_to_window,
    reading_copy,
    tokenizer_lock,
    tokenizer_spans,
)
from .hybrid import DEFAULT_HEADING_PATTERN, HeadingRule, HybridChunker
from .recursive import RecursiveChunker
from .registry import available_chunkers, get_chunker, register_chunker
from .sentence import ABBREVIATIONS, FINAL_ABBREVIATIONS, SentenceChunker, sentence_spans
from .structure import (
    CHUNK_TYPES,
    TYPE_KEY,
    TYPES_KEY,
    Block,
    TaggingChunker,
    structure,
    tag_chunks,
)

__all__ = [
    "ABBREVIATIONS",
    "CHUNK_TYPES",
    "DEFAULT_HEADING_PATTERN",
    "FINAL_ABBREVIATIONS",
    "TYPES_KEY",
    "TYPE_KEY",
    "Block",
    "Chunk",
    "Chunker",
    "ChunkerFactory",
    "HeadingRule",
    "HybridChunker",
    "RecursiveChunker",
    "SentenceChunker",
    "TaggingChunker",
    "TokenSpans",
    "available_chunkers",
    "encoding_lock",
    "fit_to_window",
    "get_chunker",
    "reading_copy",
    "register_chunker",
    "sentence_spans",
    "structure",
    "tag_chunks",
    "tokenizer_lock",
    "tokenizer_spans",
]

register_chunker("recursive", RecursiveChunker)
register_chunker("sentence", SentenceChunker)
register_chunker("hybrid", HybridChunker)
