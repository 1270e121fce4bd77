#!/bin/sh
# What the oracle agent runs: the reference solution.
echo hello > /app/answer.txt
