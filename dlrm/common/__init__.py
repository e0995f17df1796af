"""What every package builds on: user errors (`errors`), atomic writes and bounded reads (`io`), and the
loop components' cadence (`cadence`)."""
