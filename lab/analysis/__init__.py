"""The laboratory beside the codebase: what analyze.py and probe.py ask of a trained checkpoint, one
question per file (train.py imports none of it), in the order analyze.py's commands meet them:

    steps.py        what does the recurrent block do at each step? (depthwise self-CKA; per step the token
                    norm, attention entropy and distance, top-1 with the step skipped; the forward hooks)
    loops.py        does LoopVAE use its loops? (each pass truncated and bypassed, its update)
    alignment.py    does a distilled student follow its teacher's depth? (cross-CKA, its path, expert
                    deletions and gate permutations scored by teacher CKA)
    anytime.py      can each image stop when it is done? (exit rules, their traces, curves and operating points)
    ranks.py        how fully does a reViT use its expert bank? (effective ranks of the bank, gates, merged W1)
    probes.py       what do a frozen backbone's features hold? (linear, segmentation and depth heads)
"""
