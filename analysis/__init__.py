"""The laboratory beside the codebase: what analyze.py and probe.py ask of a trained checkpoint, one
question per file (train.py imports none of it):

    anytime.py      can each image stop when it is done? (exit rules, their traces and curves)
    probes.py       what do a frozen backbone's features hold? (linear, segmentation and depth heads)
"""
