"""The pure connection engine and the machines it uses (sans-IO, compiled with mypyc)."""
