"""Shadow and canary versions of the model over the same rows (``[model.candidate]``,
docs/rollout.md): the rows' arms by key hash, the shadow's comparison table and the report
over it."""
