"""CPU speed: hand-written row kernels and the prepacked linear layers that use them."""
