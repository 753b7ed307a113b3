"""Eq. 13, the score of a candidate post-decision state S', written once:

    Score(S' | S_t) = J_admit^age - J_move - J_redo - J_revoke + V_reuse

`model.ScoreTerms.total`, the daemon's decision detail and the decision log
(its writer process included, which loads this file by path: stdlib only,
no imports) all take the total from here.
"""


def score_total(j_admit: float, j_move: float, j_redo: float, j_revoke: float,
                v_reuse: float) -> float:
    """Eq. 13's total of the five terms."""
    return j_admit - j_move - j_redo - j_revoke + v_reuse
