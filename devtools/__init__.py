"""Development tools shared by the test suite, the fault-injection harness, the example's demo
and the benchmarks: throwaway database and broker servers on 127.0.0.1 (``servers``), the
source checkout's virtualenv (``venv``), and polling with a deadline (``polling``).

Standard library only (the servers and the virtualenv come before anything is installed).
It lives beside the app, not in it: the wheel holds ``django_taskclaim`` alone
(``tests/repository/test_packaging.py``), and a user's production install carries none of this.
"""
