"""The online learner: SAO and its baselines (`methods`), the training loop and publishing (`online`),
influence caps, checkpoint retention, offline replay, the critic's cold start for a learner
(`critic_start`) and the Ray actor. The loss and advantage math lives in the RL core (`liveloop.rl`)."""
