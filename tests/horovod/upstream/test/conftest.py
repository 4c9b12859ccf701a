import sys
import os

sys.path.append(os.path.join(os.path.dirname(__file__), 'utils'))
