"""shards/: the fan-out library a step function uses: shards committed one by one, redone only when unfinished.

    runner.py      run_sharded: schedule a step's shards in processes or Ray tasks, report progress
    writer.py      ShardWriter and Shard: write a shard's files, commit them with a marker
    ray_tasks.py   the Ray side of run_sharded

May import store/ (and errors, retry). Step functions reach it through `executor`'s public names.
"""
