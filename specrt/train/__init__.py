"""`specrt train-drafter`: training recipes for EAGLE-3, MTP and DFlash heads (torch; the `[train]` extra).

recipe.py runs a whole recipe (target features, training, checkpoint, held-back report); eagle3.py and dflash.py
hold each kind's trainer."""
