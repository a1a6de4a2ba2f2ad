"""The scaling ladder: fit loss against compute over the rungs and predict the target run before it starts.

Takes in: the rungs' train metrics and evaluate results. Hands on: `prediction.json` (the fit, the predicted
final loss with its band, and the predicted curve the run view draws) and `fit.png` (`scaling` fits, `ladder`
is the step).
"""
