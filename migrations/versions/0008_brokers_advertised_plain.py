"""Where plaintext clients reach a broker: `brokers.advertised_plain`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29

A broker with TLS on its TANK listener may also have a plaintext one (`--listen-plain`, for TANK's own tools on the
host). A broker redirecting a client (0xfc, tiered.server.leaders) names the leader's endpoint for the kind of
connection the client came on: `advertised` (the main listener: TLS when TLS is on) to a TLS client,
`advertised_plain` to a plaintext one. It holds the plaintext endpoint: the main listener's when TLS is off, the
plaintext listener's when TLS is on, empty when the broker has none (and in the rows of brokers older than this
revision, which are then redirected to `advertised` as before). Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("brokers") as batch:
        batch.add_column(sa.Column("advertised_plain", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("brokers") as batch:
        batch.drop_column("advertised_plain")
