"""Quality filtering and decontamination: per-document keep or drop.

Takes in: `docs/` folders (and eval sets, for decontamination). Hands on: the kept documents, with the
scores, thresholds and drop reasons in each step's stats: datatrove's heuristic filters, a fastText quality
classifier, and n-gram decontamination against evaluation sets.
"""
