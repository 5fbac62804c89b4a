"""Chains: Viterbi, the scores of labellings and their marginals, the slack-rescaled oracle and the fused hinge;
each operation"s torch, Triton and numba twins, and their dispatchers (`dispatch`)."""

from .dispatch import chain_inner, chain_labels_score, chain_marginals, slack_viterbi, viterbi

__all__ = ["viterbi", "chain_labels_score", "chain_inner", "chain_marginals", "slack_viterbi"]
