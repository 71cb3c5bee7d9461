"""The one training loop every gradient method runs on: its state, the typed rollouts, the
birth stages, loss terms and plan, the step, the run and its set-up (and SFT's loop). It
imports the maths and the method folders, never a command."""
