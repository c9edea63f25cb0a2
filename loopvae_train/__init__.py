"""What train_loopvae.py leans on beside training/ (which never imports it), one question per file:

    flags.py        which flags are LoopVAE's, and what do they resolve to? (its model and Stage-2 flags,
                    their checks, the model they build, the checkpoints a run starts from: its Entry)
    perceptual.py   the optional networks of a tokenizer run: LPIPS (a loss), rFID's Inception (a metric)
    adversarial.py  Stage 2: the discriminator and the adversarial term (--stage2)
    evaluation.py   the reconstruction metrics of each epoch, its line, the --eval-only report
"""
