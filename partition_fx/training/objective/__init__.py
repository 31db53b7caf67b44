"""What is trained and how it is scored: the objective (model, input transform, likelihood; psi), the likelihoods,
the LML and its estimate (``lml``), what a hyperparameter step scores (``estimators``), the hyper-gradient through
training (``implicit``), the whole network's Occam term (``occam``) and the evaluation metrics."""
