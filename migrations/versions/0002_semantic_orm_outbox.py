"""Create semantic_orm's outbox table (sync jobs written with each change).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "semantic_orm_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("table_name", sa.String(length=255), nullable=False),
        sa.Column("column_name", sa.String(length=255), nullable=False),
        sa.Column("row_pk", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("dead", sa.Boolean(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_semantic_orm_outbox_due", "semantic_orm_outbox", ["dead", "next_attempt_at"]
    )
    op.create_index(
        "ix_semantic_orm_outbox_row",
        "semantic_orm_outbox",
        ["table_name", "column_name", "row_pk"],
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_semantic_orm_outbox_row", table_name="semantic_orm_outbox")
    op.drop_index("ix_semantic_orm_outbox_due", table_name="semantic_orm_outbox")
    op.drop_table("semantic_orm_outbox")
