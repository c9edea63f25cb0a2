"""What train.py leans on (and train_loopvae.py beside it), one question per file, in the order a run
meets them:

    exits.py        how does a run end? (cli installs its Stop first): the stop signals, the one-line
                    failures (Fail) and the exit statuses
    flags.py        which flags are there, and what do they resolve to? (parser, --preset, checks, which
                    value a flag takes from a checkpoint; `resolved(argv)` for tools)
    run.py          what is this run? (one record of its facts, built once in main(): processes, device,
                    precision, stop, paths, length, start)
    registry.py     which model does --model name? (one record each: its builder, flags, trained depth,
                    CPU preset) and what does train.py ask of a model? (the interface)
    weights.py      what does a weights file hold, and how does it fit this model? (read_weights, never
                    code; finetune_weights; timm_vit: a timm-layout ViT as bvit.BViT)
    distill.py      the distillation term from a frozen teacher (--teacher), and that teacher
    optim.py        the optimizers, the schedule, the step (optimizer_step) and EMA
    checkpoints.py  what is saved, how a run resumes or starts from weights, the run folder
    monitor.py      around the steps (bar, estimate, device reads, stop requests, --log-every's step
                    records, --tensorboard), an epoch's end (close_epoch: its evaluation, record,
                    checkpoint, log line) and the run's lines
    figures.py      how is a figure drawn? matplotlib when installed, else one line naming the figure
                    left out; a run's curves from its log.jsonl (scripts/curves.py)
    evaluation.py   top-1 / top-5, the depth sweep and its report
"""
