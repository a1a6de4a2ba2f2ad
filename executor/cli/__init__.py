"""cli/: the command lines: `python -m executor ...` and `executor_main`, which every experiment file ends with.

    commands.py       `python -m executor status|explain|verify|compare|pin|dashboard|publish|wandb-sync`
    status_table.py   the `status` command's table
    executor_main.py  `executor_main`: an experiment file's flags, logging, the run
    error_report.py   a user's mistake reported as its message and the user's own frames, not a traceback
    wandb_sync.py     upload a train step's offline wandb runs

The top room: may import every other one.
"""
