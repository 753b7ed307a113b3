"""Sweeps and tuning over many replays (`topasd sweep`, `topasd tune`).

    replays.py  one replay as a pure function; re-timing and splitting traces
    pools.py    where replays run: this process, a process pool, Ray tasks
    sweep.py    policies x rates x seeds, averaged; saturation points; the table
    chart.py    the sweep's offline Plotly chart
    space.py    the search space, from the parameter specs
    search.py   Optuna's search on a training part; the held-out check
    report.py   the tune report, the topasd.toml fragment, the PATCH body

Optuna and Ray are optional (`pip install 'topasd[tune]'`); nothing imports
them until a command needs them.
"""
