"""TCT (Yu et al., NeurIPS 2022) building blocks: eNTK features (`features`) and the stage-2 solver (`solver`)."""
