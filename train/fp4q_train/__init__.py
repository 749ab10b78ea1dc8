"""The transformer proof (train/run.py): data, model, variants, training loop and
the fp4qd it starts. docs/TRAINING.md "A transformer with 4-bit stored weights" describes it."""
