"""The MoE network and its size: everything about the model that is not the training loop.

`model_size` is the one parameter / FLOP calculator the train step, the ladder and the hero plan share;
`config` holds the architecture's hyperparameters, below `moe_block` (router, experts; the router bias's rule
and carried state are `router_balance`'s), `moe_layers` (local/global attention layers) and `moe_model` (the LM);
`levanter_config` turns a `MoeShape` into Levanter's configs; `checkpoints` finds and loads a trained
checkpoint; `hf_export` writes the model as safetensors a Hugging Face user can load.
"""
