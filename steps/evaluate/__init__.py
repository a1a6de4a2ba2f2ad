"""The evaluate step: a trained checkpoint's loss and bits per byte on held-out data.

Takes in: a train step's checkpoints and the validation caches. Hands on: `results.json` with the per
component and macro figures that the scaling ladder fits.
"""
