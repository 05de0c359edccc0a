"""semantic_orm outbox: processing leases, permanent-failure counts, maintenance checkpoints.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("semantic_orm_outbox") as batch:
        batch.add_column(sa.Column("failures", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("claimed_by", sa.String(length=64), nullable=True))
    op.create_table(
        "semantic_orm_checkpoint",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("semantic_orm_checkpoint")
    with op.batch_alter_table("semantic_orm_outbox") as batch:
        batch.drop_column("claimed_by")
        batch.drop_column("failures")
