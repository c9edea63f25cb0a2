"""The laboratory beside the codebase: what analyze.py and probe.py ask of a trained checkpoint, one
question per file (train.py imports none of it), in the order analyze.py's commands meet them:

    steps.py        what does the recurrent block do at each step? (depthwise self-CKA; per step the token
                    norm, attention entropy and distance, top-1 with the step skipped; the forward hooks)
    loops.py        does each pass of LoopVAE's loops matter? (truncated and bypassed passes, their updates)
    alignment.py    does a student's depth follow its teacher's layers? (cross-CKA, its path, expert
                    deletions and gate permutations scored by teacher CKA)
    anytime.py      can each image stop when it is done? (exit rules, their traces, curves and operating points)
    probes.py       what do a frozen backbone's features hold? (linear, segmentation and depth heads)
"""
