"""watch/site/: the static public site, built from the dashboard's own answers and redacted.

    publish.py    `python -m executor publish`: the site's pages and data, refreshed while a run goes on
    files.py      writing the site's files and its manifest, on any store
    metrics.py    metrics lines in segments, redacted
    alerts.py     a run's alerts as the public sees them, and which runs are stalled now
    seal_witness.py  the site's own witness of each run's sealed prediction (seal.json), written once
    changes.py    what changed since the last publish, so a refresh writes only that
    redaction.py  what the public may not see: secrets, emails, hosts, other buckets

May import watch/ and watch/training/ and the rooms below watch/.
"""
