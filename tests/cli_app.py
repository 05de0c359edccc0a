"""A tiny application module for the CLI tests: ``tests.cli_app:index``.

The database URL and vector directory come from the environment, as in a real deployment. Like
the README's setup, the index is not told its models: importing them is enough.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from semantic_orm import EdgeStore, SemanticIndex
from semantic_orm.testing import HashEmbedder

from . import models  # noqa: F401  (the models this app serves)

engine = create_engine(os.environ["SEMANTIC_ORM_TEST_DB"])
Session = sessionmaker(engine)
index = SemanticIndex(
    store=EdgeStore(os.environ["SEMANTIC_ORM_TEST_VECTORS"]),
    embedder=HashEmbedder(dimension=64),
    mode="deferred",
)
index.install(Session)
