"""What every supported database must agree on, whatever its defaults (MySQL's above all)."""

from __future__ import annotations

import pytest

from django_taskclaim.models import Task
from django_taskclaim.store import mysql

pytestmark = pytest.mark.django_db(transaction=True)


def test_keys_and_tenants_compare_exactly() -> None:
    # MySQL's default collations would make these one task ('a' = 'A' = 'a '): migration 0002
    # gives tenant and key a binary, no-pad collation there.
    keys = ["job", "Job", "job ", "jöb", "JOB"]
    for key in keys:
        assert Task.objects.claim(key, owner="w").claimed, key
    for tenant in ("t", "T", "t "):
        assert Task.objects.claim("job", tenant=tenant, owner="w").claimed, tenant
    assert Task.objects.count() == len(keys) + 3
    assert Task.objects.get(key="Job", tenant="").key == "Job"
    assert not Task.objects.claim("job ", owner="other").claimed


def test_an_unreachable_mysql_server_does_not_stop_the_checks() -> None:
    from django.db import OperationalError

    class Unreachable:
        mysql_is_mariadb = True

        @property
        def mysql_version(self) -> tuple[int, ...]:
            raise OperationalError(2003, "Can't connect to server on '127.0.0.1'")

    assert mysql.store.unsupported(Unreachable()) is None
