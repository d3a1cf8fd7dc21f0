"""Masked diffusion language models: the model interface, the LLaDA sampler, the ELBO estimator and
the BGPO family of losses (issue 6)."""
