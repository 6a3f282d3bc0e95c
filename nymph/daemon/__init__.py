"""The nymph daemon: claim, render, apply, watch, report, reap."""
