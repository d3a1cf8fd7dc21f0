"""The RL core shared by the learner, the critic, BGPO and the experiments: advantages (`advantages`),
losses (`losses`), the rated-sample batch (`batch`), in-process rollouts (`rollout`) and optimizer steps
(`optim`). Pure math and data types: it imports nothing from the learner, the critic, diffusion or the
server. Import the submodules; this package stays light (no torch) so configs load fast."""
