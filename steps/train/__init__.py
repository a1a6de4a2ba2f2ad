"""The train step: Levanter's trainer on an MoE config over the tokenize stage's caches and mixture.

Takes in: caches, mixture weights, a tokenizer and a `MoeShape`. Hands on: checkpoints, `metrics.jsonl`
(`train_metrics`, live for the dashboard), wandb offline files and an HF export under its output path.
"""
