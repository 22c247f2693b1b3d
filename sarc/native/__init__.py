"""Native code: the CPU kernels in C (``kernels``) and sarc's private cache directory
(``cache``) they and the generated modules are built into."""
