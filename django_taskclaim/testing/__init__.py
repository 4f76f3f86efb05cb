"""Development tools shared by the test suite, the fault-injection harness, the example's demo
and the benchmarks: throwaway database and broker servers on 127.0.0.1 (``servers``), the
source checkout's virtualenv (``venv``), and polling with a deadline (``polling``).

Standard library only (the servers and the virtualenv come before anything is installed);
nothing else in the app imports this package.
"""
