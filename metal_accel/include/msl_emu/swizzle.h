// Swizzle member lists (generated): MA_SWZ(name, indices...) for every 2-, 3- and 4-component
// swizzle of a vector of 2, 3 and 4 components, in the xyzw and rgba spellings.
#pragma once
#define MA_SWIZZLES_2(S) \
  S(xx,0,0) S(rr,0,0) S(xy,0,1) S(rg,0,1) S(yx,1,0) S(gr,1,0) S(yy,1,1) S(gg,1,1) S(xxx,0,0,0) S(rrr,0,0,0) \
  S(xxy,0,0,1) S(rrg,0,0,1) S(xyx,0,1,0) S(rgr,0,1,0) S(xyy,0,1,1) S(rgg,0,1,1) S(yxx,1,0,0) S(grr,1,0,0) \
  S(yxy,1,0,1) S(grg,1,0,1) S(yyx,1,1,0) S(ggr,1,1,0) S(yyy,1,1,1) S(ggg,1,1,1) S(xxxx,0,0,0,0) S(rrrr,0,0,0,0) \
  S(xxxy,0,0,0,1) S(rrrg,0,0,0,1) S(xxyx,0,0,1,0) S(rrgr,0,0,1,0) S(xxyy,0,0,1,1) S(rrgg,0,0,1,1) \
  S(xyxx,0,1,0,0) S(rgrr,0,1,0,0) S(xyxy,0,1,0,1) S(rgrg,0,1,0,1) S(xyyx,0,1,1,0) S(rggr,0,1,1,0) \
  S(xyyy,0,1,1,1) S(rggg,0,1,1,1) S(yxxx,1,0,0,0) S(grrr,1,0,0,0) S(yxxy,1,0,0,1) S(grrg,1,0,0,1) \
  S(yxyx,1,0,1,0) S(grgr,1,0,1,0) S(yxyy,1,0,1,1) S(grgg,1,0,1,1) S(yyxx,1,1,0,0) S(ggrr,1,1,0,0) \
  S(yyxy,1,1,0,1) S(ggrg,1,1,0,1) S(yyyx,1,1,1,0) S(gggr,1,1,1,0) S(yyyy,1,1,1,1) S(gggg,1,1,1,1)
#define MA_SWIZZLES_3(S) \
  S(xx,0,0) S(rr,0,0) S(xy,0,1) S(rg,0,1) S(xz,0,2) S(rb,0,2) S(yx,1,0) S(gr,1,0) S(yy,1,1) S(gg,1,1) S(yz,1,2) \
  S(gb,1,2) S(zx,2,0) S(br,2,0) S(zy,2,1) S(bg,2,1) S(zz,2,2) S(bb,2,2) S(xxx,0,0,0) S(rrr,0,0,0) S(xxy,0,0,1) \
  S(rrg,0,0,1) S(xxz,0,0,2) S(rrb,0,0,2) S(xyx,0,1,0) S(rgr,0,1,0) S(xyy,0,1,1) S(rgg,0,1,1) S(xyz,0,1,2) \
  S(rgb,0,1,2) S(xzx,0,2,0) S(rbr,0,2,0) S(xzy,0,2,1) S(rbg,0,2,1) S(xzz,0,2,2) S(rbb,0,2,2) S(yxx,1,0,0) \
  S(grr,1,0,0) S(yxy,1,0,1) S(grg,1,0,1) S(yxz,1,0,2) S(grb,1,0,2) S(yyx,1,1,0) S(ggr,1,1,0) S(yyy,1,1,1) \
  S(ggg,1,1,1) S(yyz,1,1,2) S(ggb,1,1,2) S(yzx,1,2,0) S(gbr,1,2,0) S(yzy,1,2,1) S(gbg,1,2,1) S(yzz,1,2,2) \
  S(gbb,1,2,2) S(zxx,2,0,0) S(brr,2,0,0) S(zxy,2,0,1) S(brg,2,0,1) S(zxz,2,0,2) S(brb,2,0,2) S(zyx,2,1,0) \
  S(bgr,2,1,0) S(zyy,2,1,1) S(bgg,2,1,1) S(zyz,2,1,2) S(bgb,2,1,2) S(zzx,2,2,0) S(bbr,2,2,0) S(zzy,2,2,1) \
  S(bbg,2,2,1) S(zzz,2,2,2) S(bbb,2,2,2) S(xxxx,0,0,0,0) S(rrrr,0,0,0,0) S(xxxy,0,0,0,1) S(rrrg,0,0,0,1) \
  S(xxxz,0,0,0,2) S(rrrb,0,0,0,2) S(xxyx,0,0,1,0) S(rrgr,0,0,1,0) S(xxyy,0,0,1,1) S(rrgg,0,0,1,1) \
  S(xxyz,0,0,1,2) S(rrgb,0,0,1,2) S(xxzx,0,0,2,0) S(rrbr,0,0,2,0) S(xxzy,0,0,2,1) S(rrbg,0,0,2,1) \
  S(xxzz,0,0,2,2) S(rrbb,0,0,2,2) S(xyxx,0,1,0,0) S(rgrr,0,1,0,0) S(xyxy,0,1,0,1) S(rgrg,0,1,0,1) \
  S(xyxz,0,1,0,2) S(rgrb,0,1,0,2) S(xyyx,0,1,1,0) S(rggr,0,1,1,0) S(xyyy,0,1,1,1) S(rggg,0,1,1,1) \
  S(xyyz,0,1,1,2) S(rggb,0,1,1,2) S(xyzx,0,1,2,0) S(rgbr,0,1,2,0) S(xyzy,0,1,2,1) S(rgbg,0,1,2,1) \
  S(xyzz,0,1,2,2) S(rgbb,0,1,2,2) S(xzxx,0,2,0,0) S(rbrr,0,2,0,0) S(xzxy,0,2,0,1) S(rbrg,0,2,0,1) \
  S(xzxz,0,2,0,2) S(rbrb,0,2,0,2) S(xzyx,0,2,1,0) S(rbgr,0,2,1,0) S(xzyy,0,2,1,1) S(rbgg,0,2,1,1) \
  S(xzyz,0,2,1,2) S(rbgb,0,2,1,2) S(xzzx,0,2,2,0) S(rbbr,0,2,2,0) S(xzzy,0,2,2,1) S(rbbg,0,2,2,1) \
  S(xzzz,0,2,2,2) S(rbbb,0,2,2,2) S(yxxx,1,0,0,0) S(grrr,1,0,0,0) S(yxxy,1,0,0,1) S(grrg,1,0,0,1) \
  S(yxxz,1,0,0,2) S(grrb,1,0,0,2) S(yxyx,1,0,1,0) S(grgr,1,0,1,0) S(yxyy,1,0,1,1) S(grgg,1,0,1,1) \
  S(yxyz,1,0,1,2) S(grgb,1,0,1,2) S(yxzx,1,0,2,0) S(grbr,1,0,2,0) S(yxzy,1,0,2,1) S(grbg,1,0,2,1) \
  S(yxzz,1,0,2,2) S(grbb,1,0,2,2) S(yyxx,1,1,0,0) S(ggrr,1,1,0,0) S(yyxy,1,1,0,1) S(ggrg,1,1,0,1) \
  S(yyxz,1,1,0,2) S(ggrb,1,1,0,2) S(yyyx,1,1,1,0) S(gggr,1,1,1,0) S(yyyy,1,1,1,1) S(gggg,1,1,1,1) \
  S(yyyz,1,1,1,2) S(gggb,1,1,1,2) S(yyzx,1,1,2,0) S(ggbr,1,1,2,0) S(yyzy,1,1,2,1) S(ggbg,1,1,2,1) \
  S(yyzz,1,1,2,2) S(ggbb,1,1,2,2) S(yzxx,1,2,0,0) S(gbrr,1,2,0,0) S(yzxy,1,2,0,1) S(gbrg,1,2,0,1) \
  S(yzxz,1,2,0,2) S(gbrb,1,2,0,2) S(yzyx,1,2,1,0) S(gbgr,1,2,1,0) S(yzyy,1,2,1,1) S(gbgg,1,2,1,1) \
  S(yzyz,1,2,1,2) S(gbgb,1,2,1,2) S(yzzx,1,2,2,0) S(gbbr,1,2,2,0) S(yzzy,1,2,2,1) S(gbbg,1,2,2,1) \
  S(yzzz,1,2,2,2) S(gbbb,1,2,2,2) S(zxxx,2,0,0,0) S(brrr,2,0,0,0) S(zxxy,2,0,0,1) S(brrg,2,0,0,1) \
  S(zxxz,2,0,0,2) S(brrb,2,0,0,2) S(zxyx,2,0,1,0) S(brgr,2,0,1,0) S(zxyy,2,0,1,1) S(brgg,2,0,1,1) \
  S(zxyz,2,0,1,2) S(brgb,2,0,1,2) S(zxzx,2,0,2,0) S(brbr,2,0,2,0) S(zxzy,2,0,2,1) S(brbg,2,0,2,1) \
  S(zxzz,2,0,2,2) S(brbb,2,0,2,2) S(zyxx,2,1,0,0) S(bgrr,2,1,0,0) S(zyxy,2,1,0,1) S(bgrg,2,1,0,1) \
  S(zyxz,2,1,0,2) S(bgrb,2,1,0,2) S(zyyx,2,1,1,0) S(bggr,2,1,1,0) S(zyyy,2,1,1,1) S(bggg,2,1,1,1) \
  S(zyyz,2,1,1,2) S(bggb,2,1,1,2) S(zyzx,2,1,2,0) S(bgbr,2,1,2,0) S(zyzy,2,1,2,1) S(bgbg,2,1,2,1) \
  S(zyzz,2,1,2,2) S(bgbb,2,1,2,2) S(zzxx,2,2,0,0) S(bbrr,2,2,0,0) S(zzxy,2,2,0,1) S(bbrg,2,2,0,1) \
  S(zzxz,2,2,0,2) S(bbrb,2,2,0,2) S(zzyx,2,2,1,0) S(bbgr,2,2,1,0) S(zzyy,2,2,1,1) S(bbgg,2,2,1,1) \
  S(zzyz,2,2,1,2) S(bbgb,2,2,1,2) S(zzzx,2,2,2,0) S(bbbr,2,2,2,0) S(zzzy,2,2,2,1) S(bbbg,2,2,2,1) \
  S(zzzz,2,2,2,2) S(bbbb,2,2,2,2)
#define MA_SWIZZLES_4(S) \
  S(xx,0,0) S(rr,0,0) S(xy,0,1) S(rg,0,1) S(xz,0,2) S(rb,0,2) S(xw,0,3) S(ra,0,3) S(yx,1,0) S(gr,1,0) S(yy,1,1) \
  S(gg,1,1) S(yz,1,2) S(gb,1,2) S(yw,1,3) S(ga,1,3) S(zx,2,0) S(br,2,0) S(zy,2,1) S(bg,2,1) S(zz,2,2) S(bb,2,2) \
  S(zw,2,3) S(ba,2,3) S(wx,3,0) S(ar,3,0) S(wy,3,1) S(ag,3,1) S(wz,3,2) S(ab,3,2) S(ww,3,3) S(aa,3,3) \
  S(xxx,0,0,0) S(rrr,0,0,0) S(xxy,0,0,1) S(rrg,0,0,1) S(xxz,0,0,2) S(rrb,0,0,2) S(xxw,0,0,3) S(rra,0,0,3) \
  S(xyx,0,1,0) S(rgr,0,1,0) S(xyy,0,1,1) S(rgg,0,1,1) S(xyz,0,1,2) S(rgb,0,1,2) S(xyw,0,1,3) S(rga,0,1,3) \
  S(xzx,0,2,0) S(rbr,0,2,0) S(xzy,0,2,1) S(rbg,0,2,1) S(xzz,0,2,2) S(rbb,0,2,2) S(xzw,0,2,3) S(rba,0,2,3) \
  S(xwx,0,3,0) S(rar,0,3,0) S(xwy,0,3,1) S(rag,0,3,1) S(xwz,0,3,2) S(rab,0,3,2) S(xww,0,3,3) S(raa,0,3,3) \
  S(yxx,1,0,0) S(grr,1,0,0) S(yxy,1,0,1) S(grg,1,0,1) S(yxz,1,0,2) S(grb,1,0,2) S(yxw,1,0,3) S(gra,1,0,3) \
  S(yyx,1,1,0) S(ggr,1,1,0) S(yyy,1,1,1) S(ggg,1,1,1) S(yyz,1,1,2) S(ggb,1,1,2) S(yyw,1,1,3) S(gga,1,1,3) \
  S(yzx,1,2,0) S(gbr,1,2,0) S(yzy,1,2,1) S(gbg,1,2,1) S(yzz,1,2,2) S(gbb,1,2,2) S(yzw,1,2,3) S(gba,1,2,3) \
  S(ywx,1,3,0) S(gar,1,3,0) S(ywy,1,3,1) S(gag,1,3,1) S(ywz,1,3,2) S(gab,1,3,2) S(yww,1,3,3) S(gaa,1,3,3) \
  S(zxx,2,0,0) S(brr,2,0,0) S(zxy,2,0,1) S(brg,2,0,1) S(zxz,2,0,2) S(brb,2,0,2) S(zxw,2,0,3) S(bra,2,0,3) \
  S(zyx,2,1,0) S(bgr,2,1,0) S(zyy,2,1,1) S(bgg,2,1,1) S(zyz,2,1,2) S(bgb,2,1,2) S(zyw,2,1,3) S(bga,2,1,3) \
  S(zzx,2,2,0) S(bbr,2,2,0) S(zzy,2,2,1) S(bbg,2,2,1) S(zzz,2,2,2) S(bbb,2,2,2) S(zzw,2,2,3) S(bba,2,2,3) \
  S(zwx,2,3,0) S(bar,2,3,0) S(zwy,2,3,1) S(bag,2,3,1) S(zwz,2,3,2) S(bab,2,3,2) S(zww,2,3,3) S(baa,2,3,3) \
  S(wxx,3,0,0) S(arr,3,0,0) S(wxy,3,0,1) S(arg,3,0,1) S(wxz,3,0,2) S(arb,3,0,2) S(wxw,3,0,3) S(ara,3,0,3) \
  S(wyx,3,1,0) S(agr,3,1,0) S(wyy,3,1,1) S(agg,3,1,1) S(wyz,3,1,2) S(agb,3,1,2) S(wyw,3,1,3) S(aga,3,1,3) \
  S(wzx,3,2,0) S(abr,3,2,0) S(wzy,3,2,1) S(abg,3,2,1) S(wzz,3,2,2) S(abb,3,2,2) S(wzw,3,2,3) S(aba,3,2,3) \
  S(wwx,3,3,0) S(aar,3,3,0) S(wwy,3,3,1) S(aag,3,3,1) S(wwz,3,3,2) S(aab,3,3,2) S(www,3,3,3) S(aaa,3,3,3) \
  S(xxxx,0,0,0,0) S(rrrr,0,0,0,0) S(xxxy,0,0,0,1) S(rrrg,0,0,0,1) S(xxxz,0,0,0,2) S(rrrb,0,0,0,2) \
  S(xxxw,0,0,0,3) S(rrra,0,0,0,3) S(xxyx,0,0,1,0) S(rrgr,0,0,1,0) S(xxyy,0,0,1,1) S(rrgg,0,0,1,1) \
  S(xxyz,0,0,1,2) S(rrgb,0,0,1,2) S(xxyw,0,0,1,3) S(rrga,0,0,1,3) S(xxzx,0,0,2,0) S(rrbr,0,0,2,0) \
  S(xxzy,0,0,2,1) S(rrbg,0,0,2,1) S(xxzz,0,0,2,2) S(rrbb,0,0,2,2) S(xxzw,0,0,2,3) S(rrba,0,0,2,3) \
  S(xxwx,0,0,3,0) S(rrar,0,0,3,0) S(xxwy,0,0,3,1) S(rrag,0,0,3,1) S(xxwz,0,0,3,2) S(rrab,0,0,3,2) \
  S(xxww,0,0,3,3) S(rraa,0,0,3,3) S(xyxx,0,1,0,0) S(rgrr,0,1,0,0) S(xyxy,0,1,0,1) S(rgrg,0,1,0,1) \
  S(xyxz,0,1,0,2) S(rgrb,0,1,0,2) S(xyxw,0,1,0,3) S(rgra,0,1,0,3) S(xyyx,0,1,1,0) S(rggr,0,1,1,0) \
  S(xyyy,0,1,1,1) S(rggg,0,1,1,1) S(xyyz,0,1,1,2) S(rggb,0,1,1,2) S(xyyw,0,1,1,3) S(rgga,0,1,1,3) \
  S(xyzx,0,1,2,0) S(rgbr,0,1,2,0) S(xyzy,0,1,2,1) S(rgbg,0,1,2,1) S(xyzz,0,1,2,2) S(rgbb,0,1,2,2) \
  S(xyzw,0,1,2,3) S(rgba,0,1,2,3) S(xywx,0,1,3,0) S(rgar,0,1,3,0) S(xywy,0,1,3,1) S(rgag,0,1,3,1) \
  S(xywz,0,1,3,2) S(rgab,0,1,3,2) S(xyww,0,1,3,3) S(rgaa,0,1,3,3) S(xzxx,0,2,0,0) S(rbrr,0,2,0,0) \
  S(xzxy,0,2,0,1) S(rbrg,0,2,0,1) S(xzxz,0,2,0,2) S(rbrb,0,2,0,2) S(xzxw,0,2,0,3) S(rbra,0,2,0,3) \
  S(xzyx,0,2,1,0) S(rbgr,0,2,1,0) S(xzyy,0,2,1,1) S(rbgg,0,2,1,1) S(xzyz,0,2,1,2) S(rbgb,0,2,1,2) \
  S(xzyw,0,2,1,3) S(rbga,0,2,1,3) S(xzzx,0,2,2,0) S(rbbr,0,2,2,0) S(xzzy,0,2,2,1) S(rbbg,0,2,2,1) \
  S(xzzz,0,2,2,2) S(rbbb,0,2,2,2) S(xzzw,0,2,2,3) S(rbba,0,2,2,3) S(xzwx,0,2,3,0) S(rbar,0,2,3,0) \
  S(xzwy,0,2,3,1) S(rbag,0,2,3,1) S(xzwz,0,2,3,2) S(rbab,0,2,3,2) S(xzww,0,2,3,3) S(rbaa,0,2,3,3) \
  S(xwxx,0,3,0,0) S(rarr,0,3,0,0) S(xwxy,0,3,0,1) S(rarg,0,3,0,1) S(xwxz,0,3,0,2) S(rarb,0,3,0,2) \
  S(xwxw,0,3,0,3) S(rara,0,3,0,3) S(xwyx,0,3,1,0) S(ragr,0,3,1,0) S(xwyy,0,3,1,1) S(ragg,0,3,1,1) \
  S(xwyz,0,3,1,2) S(ragb,0,3,1,2) S(xwyw,0,3,1,3) S(raga,0,3,1,3) S(xwzx,0,3,2,0) S(rabr,0,3,2,0) \
  S(xwzy,0,3,2,1) S(rabg,0,3,2,1) S(xwzz,0,3,2,2) S(rabb,0,3,2,2) S(xwzw,0,3,2,3) S(raba,0,3,2,3) \
  S(xwwx,0,3,3,0) S(raar,0,3,3,0) S(xwwy,0,3,3,1) S(raag,0,3,3,1) S(xwwz,0,3,3,2) S(raab,0,3,3,2) \
  S(xwww,0,3,3,3) S(raaa,0,3,3,3) S(yxxx,1,0,0,0) S(grrr,1,0,0,0) S(yxxy,1,0,0,1) S(grrg,1,0,0,1) \
  S(yxxz,1,0,0,2) S(grrb,1,0,0,2) S(yxxw,1,0,0,3) S(grra,1,0,0,3) S(yxyx,1,0,1,0) S(grgr,1,0,1,0) \
  S(yxyy,1,0,1,1) S(grgg,1,0,1,1) S(yxyz,1,0,1,2) S(grgb,1,0,1,2) S(yxyw,1,0,1,3) S(grga,1,0,1,3) \
  S(yxzx,1,0,2,0) S(grbr,1,0,2,0) S(yxzy,1,0,2,1) S(grbg,1,0,2,1) S(yxzz,1,0,2,2) S(grbb,1,0,2,2) \
  S(yxzw,1,0,2,3) S(grba,1,0,2,3) S(yxwx,1,0,3,0) S(grar,1,0,3,0) S(yxwy,1,0,3,1) S(grag,1,0,3,1) \
  S(yxwz,1,0,3,2) S(grab,1,0,3,2) S(yxww,1,0,3,3) S(graa,1,0,3,3) S(yyxx,1,1,0,0) S(ggrr,1,1,0,0) \
  S(yyxy,1,1,0,1) S(ggrg,1,1,0,1) S(yyxz,1,1,0,2) S(ggrb,1,1,0,2) S(yyxw,1,1,0,3) S(ggra,1,1,0,3) \
  S(yyyx,1,1,1,0) S(gggr,1,1,1,0) S(yyyy,1,1,1,1) S(gggg,1,1,1,1) S(yyyz,1,1,1,2) S(gggb,1,1,1,2) \
  S(yyyw,1,1,1,3) S(ggga,1,1,1,3) S(yyzx,1,1,2,0) S(ggbr,1,1,2,0) S(yyzy,1,1,2,1) S(ggbg,1,1,2,1) \
  S(yyzz,1,1,2,2) S(ggbb,1,1,2,2) S(yyzw,1,1,2,3) S(ggba,1,1,2,3) S(yywx,1,1,3,0) S(ggar,1,1,3,0) \
  S(yywy,1,1,3,1) S(ggag,1,1,3,1) S(yywz,1,1,3,2) S(ggab,1,1,3,2) S(yyww,1,1,3,3) S(ggaa,1,1,3,3) \
  S(yzxx,1,2,0,0) S(gbrr,1,2,0,0) S(yzxy,1,2,0,1) S(gbrg,1,2,0,1) S(yzxz,1,2,0,2) S(gbrb,1,2,0,2) \
  S(yzxw,1,2,0,3) S(gbra,1,2,0,3) S(yzyx,1,2,1,0) S(gbgr,1,2,1,0) S(yzyy,1,2,1,1) S(gbgg,1,2,1,1) \
  S(yzyz,1,2,1,2) S(gbgb,1,2,1,2) S(yzyw,1,2,1,3) S(gbga,1,2,1,3) S(yzzx,1,2,2,0) S(gbbr,1,2,2,0) \
  S(yzzy,1,2,2,1) S(gbbg,1,2,2,1) S(yzzz,1,2,2,2) S(gbbb,1,2,2,2) S(yzzw,1,2,2,3) S(gbba,1,2,2,3) \
  S(yzwx,1,2,3,0) S(gbar,1,2,3,0) S(yzwy,1,2,3,1) S(gbag,1,2,3,1) S(yzwz,1,2,3,2) S(gbab,1,2,3,2) \
  S(yzww,1,2,3,3) S(gbaa,1,2,3,3) S(ywxx,1,3,0,0) S(garr,1,3,0,0) S(ywxy,1,3,0,1) S(garg,1,3,0,1) \
  S(ywxz,1,3,0,2) S(garb,1,3,0,2) S(ywxw,1,3,0,3) S(gara,1,3,0,3) S(ywyx,1,3,1,0) S(gagr,1,3,1,0) \
  S(ywyy,1,3,1,1) S(gagg,1,3,1,1) S(ywyz,1,3,1,2) S(gagb,1,3,1,2) S(ywyw,1,3,1,3) S(gaga,1,3,1,3) \
  S(ywzx,1,3,2,0) S(gabr,1,3,2,0) S(ywzy,1,3,2,1) S(gabg,1,3,2,1) S(ywzz,1,3,2,2) S(gabb,1,3,2,2) \
  S(ywzw,1,3,2,3) S(gaba,1,3,2,3) S(ywwx,1,3,3,0) S(gaar,1,3,3,0) S(ywwy,1,3,3,1) S(gaag,1,3,3,1) \
  S(ywwz,1,3,3,2) S(gaab,1,3,3,2) S(ywww,1,3,3,3) S(gaaa,1,3,3,3) S(zxxx,2,0,0,0) S(brrr,2,0,0,0) \
  S(zxxy,2,0,0,1) S(brrg,2,0,0,1) S(zxxz,2,0,0,2) S(brrb,2,0,0,2) S(zxxw,2,0,0,3) S(brra,2,0,0,3) \
  S(zxyx,2,0,1,0) S(brgr,2,0,1,0) S(zxyy,2,0,1,1) S(brgg,2,0,1,1) S(zxyz,2,0,1,2) S(brgb,2,0,1,2) \
  S(zxyw,2,0,1,3) S(brga,2,0,1,3) S(zxzx,2,0,2,0) S(brbr,2,0,2,0) S(zxzy,2,0,2,1) S(brbg,2,0,2,1) \
  S(zxzz,2,0,2,2) S(brbb,2,0,2,2) S(zxzw,2,0,2,3) S(brba,2,0,2,3) S(zxwx,2,0,3,0) S(brar,2,0,3,0) \
  S(zxwy,2,0,3,1) S(brag,2,0,3,1) S(zxwz,2,0,3,2) S(brab,2,0,3,2) S(zxww,2,0,3,3) S(braa,2,0,3,3) \
  S(zyxx,2,1,0,0) S(bgrr,2,1,0,0) S(zyxy,2,1,0,1) S(bgrg,2,1,0,1) S(zyxz,2,1,0,2) S(bgrb,2,1,0,2) \
  S(zyxw,2,1,0,3) S(bgra,2,1,0,3) S(zyyx,2,1,1,0) S(bggr,2,1,1,0) S(zyyy,2,1,1,1) S(bggg,2,1,1,1) \
  S(zyyz,2,1,1,2) S(bggb,2,1,1,2) S(zyyw,2,1,1,3) S(bgga,2,1,1,3) S(zyzx,2,1,2,0) S(bgbr,2,1,2,0) \
  S(zyzy,2,1,2,1) S(bgbg,2,1,2,1) S(zyzz,2,1,2,2) S(bgbb,2,1,2,2) S(zyzw,2,1,2,3) S(bgba,2,1,2,3) \
  S(zywx,2,1,3,0) S(bgar,2,1,3,0) S(zywy,2,1,3,1) S(bgag,2,1,3,1) S(zywz,2,1,3,2) S(bgab,2,1,3,2) \
  S(zyww,2,1,3,3) S(bgaa,2,1,3,3) S(zzxx,2,2,0,0) S(bbrr,2,2,0,0) S(zzxy,2,2,0,1) S(bbrg,2,2,0,1) \
  S(zzxz,2,2,0,2) S(bbrb,2,2,0,2) S(zzxw,2,2,0,3) S(bbra,2,2,0,3) S(zzyx,2,2,1,0) S(bbgr,2,2,1,0) \
  S(zzyy,2,2,1,1) S(bbgg,2,2,1,1) S(zzyz,2,2,1,2) S(bbgb,2,2,1,2) S(zzyw,2,2,1,3) S(bbga,2,2,1,3) \
  S(zzzx,2,2,2,0) S(bbbr,2,2,2,0) S(zzzy,2,2,2,1) S(bbbg,2,2,2,1) S(zzzz,2,2,2,2) S(bbbb,2,2,2,2) \
  S(zzzw,2,2,2,3) S(bbba,2,2,2,3) S(zzwx,2,2,3,0) S(bbar,2,2,3,0) S(zzwy,2,2,3,1) S(bbag,2,2,3,1) \
  S(zzwz,2,2,3,2) S(bbab,2,2,3,2) S(zzww,2,2,3,3) S(bbaa,2,2,3,3) S(zwxx,2,3,0,0) S(barr,2,3,0,0) \
  S(zwxy,2,3,0,1) S(barg,2,3,0,1) S(zwxz,2,3,0,2) S(barb,2,3,0,2) S(zwxw,2,3,0,3) S(bara,2,3,0,3) \
  S(zwyx,2,3,1,0) S(bagr,2,3,1,0) S(zwyy,2,3,1,1) S(bagg,2,3,1,1) S(zwyz,2,3,1,2) S(bagb,2,3,1,2) \
  S(zwyw,2,3,1,3) S(baga,2,3,1,3) S(zwzx,2,3,2,0) S(babr,2,3,2,0) S(zwzy,2,3,2,1) S(babg,2,3,2,1) \
  S(zwzz,2,3,2,2) S(babb,2,3,2,2) S(zwzw,2,3,2,3) S(baba,2,3,2,3) S(zwwx,2,3,3,0) S(baar,2,3,3,0) \
  S(zwwy,2,3,3,1) S(baag,2,3,3,1) S(zwwz,2,3,3,2) S(baab,2,3,3,2) S(zwww,2,3,3,3) S(baaa,2,3,3,3) \
  S(wxxx,3,0,0,0) S(arrr,3,0,0,0) S(wxxy,3,0,0,1) S(arrg,3,0,0,1) S(wxxz,3,0,0,2) S(arrb,3,0,0,2) \
  S(wxxw,3,0,0,3) S(arra,3,0,0,3) S(wxyx,3,0,1,0) S(argr,3,0,1,0) S(wxyy,3,0,1,1) S(argg,3,0,1,1) \
  S(wxyz,3,0,1,2) S(argb,3,0,1,2) S(wxyw,3,0,1,3) S(arga,3,0,1,3) S(wxzx,3,0,2,0) S(arbr,3,0,2,0) \
  S(wxzy,3,0,2,1) S(arbg,3,0,2,1) S(wxzz,3,0,2,2) S(arbb,3,0,2,2) S(wxzw,3,0,2,3) S(arba,3,0,2,3) \
  S(wxwx,3,0,3,0) S(arar,3,0,3,0) S(wxwy,3,0,3,1) S(arag,3,0,3,1) S(wxwz,3,0,3,2) S(arab,3,0,3,2) \
  S(wxww,3,0,3,3) S(araa,3,0,3,3) S(wyxx,3,1,0,0) S(agrr,3,1,0,0) S(wyxy,3,1,0,1) S(agrg,3,1,0,1) \
  S(wyxz,3,1,0,2) S(agrb,3,1,0,2) S(wyxw,3,1,0,3) S(agra,3,1,0,3) S(wyyx,3,1,1,0) S(aggr,3,1,1,0) \
  S(wyyy,3,1,1,1) S(aggg,3,1,1,1) S(wyyz,3,1,1,2) S(aggb,3,1,1,2) S(wyyw,3,1,1,3) S(agga,3,1,1,3) \
  S(wyzx,3,1,2,0) S(agbr,3,1,2,0) S(wyzy,3,1,2,1) S(agbg,3,1,2,1) S(wyzz,3,1,2,2) S(agbb,3,1,2,2) \
  S(wyzw,3,1,2,3) S(agba,3,1,2,3) S(wywx,3,1,3,0) S(agar,3,1,3,0) S(wywy,3,1,3,1) S(agag,3,1,3,1) \
  S(wywz,3,1,3,2) S(agab,3,1,3,2) S(wyww,3,1,3,3) S(agaa,3,1,3,3) S(wzxx,3,2,0,0) S(abrr,3,2,0,0) \
  S(wzxy,3,2,0,1) S(abrg,3,2,0,1) S(wzxz,3,2,0,2) S(abrb,3,2,0,2) S(wzxw,3,2,0,3) S(abra,3,2,0,3) \
  S(wzyx,3,2,1,0) S(abgr,3,2,1,0) S(wzyy,3,2,1,1) S(abgg,3,2,1,1) S(wzyz,3,2,1,2) S(abgb,3,2,1,2) \
  S(wzyw,3,2,1,3) S(abga,3,2,1,3) S(wzzx,3,2,2,0) S(abbr,3,2,2,0) S(wzzy,3,2,2,1) S(abbg,3,2,2,1) \
  S(wzzz,3,2,2,2) S(abbb,3,2,2,2) S(wzzw,3,2,2,3) S(abba,3,2,2,3) S(wzwx,3,2,3,0) S(abar,3,2,3,0) \
  S(wzwy,3,2,3,1) S(abag,3,2,3,1) S(wzwz,3,2,3,2) S(abab,3,2,3,2) S(wzww,3,2,3,3) S(abaa,3,2,3,3) \
  S(wwxx,3,3,0,0) S(aarr,3,3,0,0) S(wwxy,3,3,0,1) S(aarg,3,3,0,1) S(wwxz,3,3,0,2) S(aarb,3,3,0,2) \
  S(wwxw,3,3,0,3) S(aara,3,3,0,3) S(wwyx,3,3,1,0) S(aagr,3,3,1,0) S(wwyy,3,3,1,1) S(aagg,3,3,1,1) \
  S(wwyz,3,3,1,2) S(aagb,3,3,1,2) S(wwyw,3,3,1,3) S(aaga,3,3,1,3) S(wwzx,3,3,2,0) S(aabr,3,3,2,0) \
  S(wwzy,3,3,2,1) S(aabg,3,3,2,1) S(wwzz,3,3,2,2) S(aabb,3,3,2,2) S(wwzw,3,3,2,3) S(aaba,3,3,2,3) \
  S(wwwx,3,3,3,0) S(aaar,3,3,3,0) S(wwwy,3,3,3,1) S(aaag,3,3,3,1) S(wwwz,3,3,3,2) S(aaab,3,3,3,2) \
  S(wwww,3,3,3,3) S(aaaa,3,3,3,3)
