"""What the tests of the sharded configurations share (tests/databases/test_sharded.py,
tests/processes/test_sharded_processes.py): the two task databases, three tenants of each, and
their marks."""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.routers import TenantHash, tenants_on

A, B = TenantHash.databases
ON_A = tenants_on(A, 3, "acme-")
ON_B = tenants_on(B, 3, "bolt-")
SHARDED_TESTS = [
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif("shard2" not in settings.DATABASES, reason="the sharded configurations only"),
]
