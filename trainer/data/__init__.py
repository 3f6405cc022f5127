"""What a run learns from: prompt data, PTX text, synthetic tasks, reward functions and tiny scorers."""
