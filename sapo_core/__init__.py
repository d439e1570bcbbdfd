"""The SAPO algorithm without storage or orchestration: tasks, rewards, policy, GRPO.

Swarm sAmpling Policy Optimization (arXiv 2509.08721), not TRL's `loss_type="sapo"` (Soft
Adaptive Policy Optimization, an unrelated loss).
"""
