"""Progressive delivery: the operator's commands on rollouts (:mod:`app.rollout.ops`) and the
controller that steps them (:mod:`app.rollout.driver`); the decisions themselves are pure
(:mod:`app.routing.rollout`)."""
