# Made by lucid_amp_trainer from h200_cnn_train_log.csv; rerun: gnuplot h200_cnn_train_curves.gp
set datafile separator ','
set terminal pngcairo size 1200,900 font 'sans,11'
set output 'h200_cnn_train_curves.png'
set multiplot layout 2,1 title 'lucid-amp on Fashion-MNIST: 60000 training images, 2 epoch(s), CUDA'
set grid
set key top right
set xlabel 'step'
set title 'training loss (mean of the last 20 steps)'
set ylabel 'loss'
plot 'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'fp32' ? $4 : 1/0) with lines lw 3 dt 1 lc rgb '#1f77b4' title 'fp32', \
     'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'fp16' ? $4 : 1/0) with lines lw 3 dt 1 lc rgb '#d62728' title 'fp16', \
     'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'fp16-scaled' ? $4 : 1/0) with lines lw 2 dt 2 lc rgb '#2ca02c' title 'fp16-scaled', \
     'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'bf16' ? $4 : 1/0) with lines lw 2 dt 3 lc rgb '#9467bd' title 'bf16'
set title 'loss scale (grows after each growth interval of clean steps, halves on overflow)'
set ylabel 'scale'
set logscale y 2
set format y '2^{%L}'
plot 'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'fp16-scaled' ? $5 : 1/0) with steps lw 2 lc rgb '#2ca02c' title 'fp16-scaled scale', \
     'h200_cnn_train_log.csv' every ::1 using 2:(strcol(1) eq 'fp16-scaled' && $7 > 0 ? $5 : 1/0) with points pt 7 ps 0.8 lc rgb 'black' title 'overflow: step skipped'
unset multiplot
